"""Binlog column type codes (MySQL include/field_types.h enum_field_types), as a
Table_map event lists them, and their names."""

from __future__ import annotations

T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_NULL, T_TIMESTAMP = 0, 1, 2, 3, 4, 5, 6, 7
T_LONGLONG, T_INT24, T_DATE, T_TIME, T_DATETIME, T_YEAR, T_NEWDATE, T_VARCHAR = 8, 9, 10, 11, 12, 13, 14, 15
T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 16, 17, 18, 19
T_VECTOR, T_JSON, T_NEWDECIMAL, T_ENUM, T_SET = 242, 245, 246, 247, 248
T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB, T_BLOB, T_VAR_STRING, T_STRING, T_GEOMETRY = 249, 250, 251, 252, 253, 254, 255

TYPE_NAMES = {
    0: "DECIMAL",
    1: "TINY",
    2: "SHORT",
    3: "LONG",
    4: "FLOAT",
    5: "DOUBLE",
    6: "NULL",
    7: "TIMESTAMP",
    8: "LONGLONG",
    9: "INT24",
    10: "DATE",
    11: "TIME",
    12: "DATETIME",
    13: "YEAR",
    14: "NEWDATE",
    15: "VARCHAR",
    16: "BIT",
    17: "TIMESTAMP2",
    18: "DATETIME2",
    19: "TIME2",
    20: "TYPED_ARRAY",
    242: "VECTOR",
    243: "BOOL",
    244: "INVALID",
    245: "JSON",
    246: "NEWDECIMAL",
    247: "ENUM",
    248: "SET",
    249: "TINY_BLOB",
    250: "MEDIUM_BLOB",
    251: "LONG_BLOB",
    252: "BLOB",
    253: "VAR_STRING",
    254: "STRING",
    255: "GEOMETRY",
}
NUMERIC = {T_TINY, T_SHORT, T_INT24, T_LONG, T_LONGLONG, T_NEWDECIMAL, T_FLOAT, T_DOUBLE, T_YEAR}
