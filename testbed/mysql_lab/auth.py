"""The connection phase: the greeting, the client's answer and `caching_sha2_password`.

Layouts and exchanges, from MySQL's documentation and source:

  Handshake v10     protocol version 0x0a, server version NUL-terminated, connection id 4,
  (server greeting) auth-plugin-data part 1 (8), filler 0x00, capabilities low 2, character
                    set 1, status flags 2, capabilities high 2, auth-plugin-data length 1
                    (21), reserved 10 zero bytes, auth-plugin-data part 2 (12 + NUL), the
                    plugin name NUL-terminated (page_protocol_connection_phase_packets_
                    protocol_handshake_v10.html)
  HandshakeResponse41  capabilities 4, max packet 4, character set 1, filler 23, user NUL,
                    auth response (lenenc with PLUGIN_AUTH_LENENC_CLIENT_DATA, else length
                    byte), database NUL (CONNECT_WITH_DB), plugin name NUL (PLUGIN_AUTH),
                    attributes (CONNECT_ATTRS) (..._protocol_handshake_response.html)
  caching_sha2_password (sql/auth/sha2_password.cc, page_caching_sha2_authentication_
                    exchanges.html): the client sends XOR(SHA256(pw), SHA256(SHA256(SHA256(pw))
                    + nonce)). A server whose cache holds SHA256(SHA256(pw)) for the account
                    checks it and answers AuthMoreData 0x01 0x03 (fast_auth_success), then
                    OK. Otherwise 0x01 0x04 (perform_full_authentication); without TLS the
                    client asks for the public key with 0x02, the server answers 0x01 + PEM,
                    the client sends RSA-OAEP(SHA1) of (pw + NUL) XOR nonce; a right password
                    is cached (the next login takes the fast path).
  mysql_native_password  SHA1(pw) XOR SHA1(nonce + SHA1(SHA1(pw))) (sql/auth/password.cc),
                    accepted when a client names this plugin in its answer (8.x; 9.0 removed
                    the plugin: such a client gets an AuthSwitchRequest to caching_sha2_password).
  A wrong password: ER_ACCESS_DENIED_ERROR 1045, SQLSTATE 28000, "Access denied for user
                    'u'@'host' (using password: YES)".
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import ssl
import struct
import threading
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from testbed.mysql_lab.protocol import (
    CLIENT_CONNECT_ATTRS,
    CLIENT_CONNECT_WITH_DB,
    CLIENT_PLUGIN_AUTH,
    CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA,
    CLIENT_SSL,
    SERVER_CAPABILITIES,
    SERVER_STATUS_AUTOCOMMIT,
    UTF8MB4_0900_AI_CI,
    MysqlError,
    PacketChannel,
    ok_packet,
    read_lenenc_int,
)

log = logging.getLogger("testbed.mysql_lab")

CACHING_SHA2 = "caching_sha2_password"
NATIVE = "mysql_native_password"
LATIN1_SWEDISH_CI = 8
NONCE_LENGTH = 20
CONNECT_TIMEOUT_S = 10.0  # connect_timeout's default: the login must be over by then

ER_ACCESS_DENIED_ERROR = 1045
ER_HANDSHAKE_ERROR = 1043


def make_nonce() -> bytes:
    """20 random bytes without NUL or '$', as generate_user_salt() makes them
    (mysys/crypt_genhash_impl.cc): they travel NUL-terminated."""
    out = bytearray()
    while len(out) < NONCE_LENGTH:
        for b in os.urandom(NONCE_LENGTH):
            b &= 0x7F
            if b not in (0, ord("$")) and len(out) < NONCE_LENGTH:
                out.append(b)
    return bytes(out)


def greeting(
    server_version: str, connection_id: int, nonce: bytes, tls: bool = False, plugin: str = CACHING_SHA2
) -> bytes:
    """Handshake v10 offering `plugin` (caching_sha2_password, MySQL 8's default;
    mysql_native_password, 5.7's), and TLS (CLIENT_SSL) when the lab has a certificate. The
    character set byte: utf8mb4_0900_ai_ci on 8.x, latin1_swedish_ci (8, 5.7's
    character_set_server default) on 5.7."""
    caps = SERVER_CAPABILITIES | (CLIENT_SSL if tls else 0)
    charset = UTF8MB4_0900_AI_CI if plugin == CACHING_SHA2 else LATIN1_SWEDISH_CI
    return (
        b"\x0a"
        + server_version.encode() + b"\x00"
        + struct.pack("<I", connection_id)
        + nonce[:8] + b"\x00"
        + struct.pack("<HBHH", caps & 0xFFFF, charset, SERVER_STATUS_AUTOCOMMIT, caps >> 16)
        + bytes([len(nonce) + 1])
        + b"\x00" * 10
        + nonce[8:] + b"\x00"
        + plugin.encode() + b"\x00"
    )  # fmt: skip


@dataclass
class HandshakeResponse:
    capabilities: int
    user: str
    auth_response: bytes
    database: str | None
    plugin: str
    attributes: dict[str, str] = field(default_factory=dict)


def parse_handshake_response(data: bytes) -> HandshakeResponse:
    """HandshakeResponse41; an SSLRequest (32 bytes, CLIENT_SSL) is refused by the caller
    since the lab never offers TLS."""
    if len(data) < 33:
        raise MysqlError(ER_HANDSHAKE_ERROR, "08S01", "Bad handshake")
    caps = struct.unpack_from("<I", data, 0)[0]
    pos = 32
    end = data.index(b"\x00", pos)
    user = data[pos:end].decode("utf-8")
    pos = end + 1
    if caps & CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA:
        n, pos = read_lenenc_int(data, pos)
    else:
        n, pos = data[pos], pos + 1
    auth = data[pos : pos + n]
    pos += n
    database = None
    if caps & CLIENT_CONNECT_WITH_DB and pos < len(data):
        end = data.index(b"\x00", pos)
        database = data[pos:end].decode("utf-8")
        pos = end + 1
    plugin = ""
    if caps & CLIENT_PLUGIN_AUTH and pos < len(data):
        end = data.find(b"\x00", pos)
        end = len(data) if end < 0 else end
        plugin = data[pos:end].decode("ascii", "replace")
        pos = end + 1
    attributes: dict[str, str] = {}
    if caps & CLIENT_CONNECT_ATTRS and pos < len(data):
        total, pos = read_lenenc_int(data, pos)
        stop = pos + total
        while pos < stop:
            kn, pos = read_lenenc_int(data, pos)
            key = data[pos : pos + kn].decode("utf-8", "replace")
            pos += kn
            vn, pos = read_lenenc_int(data, pos)
            attributes[key] = data[pos : pos + vn].decode("utf-8", "replace")
            pos += vn
    return HandshakeResponse(caps, user, auth, database, plugin or CACHING_SHA2, attributes)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=False))


def caching_sha2_scramble_ok(stored: bytes, nonce: bytes, scramble: bytes) -> bool:
    """The fast path's check (sha2_password.cc, Validate_scramble): with stored =
    SHA256(SHA256(pw)), SHA256(stored + nonce) XOR scramble is SHA256(pw) when the client
    knows the password; its SHA256 must be `stored`."""
    if len(scramble) != 32:
        return False
    candidate = _xor(scramble, _sha256(stored + nonce))
    return hmac.compare_digest(_sha256(candidate), stored)


def native_scramble_ok(password: str, nonce: bytes, scramble: bytes) -> bool:
    """mysql_native_password (sql/auth/password.cc, check_scramble)."""
    if not password:
        return scramble == b""
    stage1 = hashlib.sha1(password.encode()).digest()
    expected = _xor(stage1, hashlib.sha1(nonce[:20] + hashlib.sha1(stage1).digest()).digest())
    return hmac.compare_digest(expected, scramble)


class Accounts:
    """The lab's one account, its RSA key pair and caching_sha2_password's cache (empty
    at start, as after a MySQL restart: the first login takes the full path)."""

    def __init__(self, user: str, password: str):
        self.user = user
        self.password = password
        self._cache: set[str] = set()
        self._lock = threading.Lock()
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.public_pem = self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def cached(self, user: str) -> bool:
        with self._lock:
            return user in self._cache

    def remember(self, user: str) -> None:
        with self._lock:
            self._cache.add(user)

    def stored_hash(self) -> bytes:
        return _sha256(_sha256(self.password.encode()))

    def decrypt(self, data: bytes, nonce: bytes) -> bytes | None:
        """The password of a full authentication: RSA-OAEP with SHA-1 (sha2_password.cc,
        as PyMySQL's sha2_rsa_encrypt), then XOR with the nonce, NUL-terminated."""
        try:
            plain = self._key.decrypt(
                data, padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
            )
        except ValueError:
            return None
        clear = bytes(b ^ nonce[i % len(nonce)] for i, b in enumerate(plain))
        return clear[:-1] if clear.endswith(b"\x00") else clear


def denied(user: str, host: str, with_password: bool) -> MysqlError:
    return MysqlError(
        ER_ACCESS_DENIED_ERROR,
        "28000",
        f"Access denied for user '{user}'@'{host}' (using password: {'YES' if with_password else 'NO'})",
    )


def authenticate(
    channel: PacketChannel,
    accounts: Accounts,
    nonce: bytes,
    host: str,
    native_available: bool = True,
    tls: ssl.SSLContext | None = None,
    native_only: bool = False,
) -> HandshakeResponse:
    """Read the client's answer to the greeting and run its plugin's exchange; send OK on
    success. Raises MysqlError (the caller sends it and closes) on a refused login.
    `native_available=False` (MySQL 9, which removed mysql_native_password): a client that
    answers with it is switched to caching_sha2_password. With `tls`, a client may first
    send an SSLRequest (page_protocol_connection_phase_packets_protocol_ssl_request.html:
    the first 32 bytes of a HandshakeResponse41, CLIENT_SSL set); the TLS handshake follows
    and the HandshakeResponse41 comes over TLS."""
    first = channel.read_packet(CONNECT_TIMEOUT_S)
    secure = False
    if tls is not None and len(first) == 32 and struct.unpack_from("<I", first, 0)[0] & CLIENT_SSL:
        channel.start_tls(tls)
        secure = True
        first = channel.read_packet(CONNECT_TIMEOUT_S)
    answer = parse_handshake_response(first)
    if answer.user != accounts.user:
        raise denied(answer.user, host, bool(answer.auth_response))
    if native_only and answer.plugin != NATIVE:
        # MySQL 5.7: the account's plugin is mysql_native_password and the server has no
        # caching_sha2_password (8.0.3 added it); a client answering with another plugin
        # is switched (AuthSwitchRequest, as below) to the account's.
        channel.write_packet(b"\xfe" + NATIVE.encode() + b"\x00" + nonce + b"\x00")
        answer.auth_response = channel.read_packet(CONNECT_TIMEOUT_S)
        answer.plugin = NATIVE
    if answer.plugin == NATIVE and native_available:
        if not native_scramble_ok(accounts.password, nonce, answer.auth_response):
            raise denied(answer.user, host, bool(answer.auth_response))
        log.info("login %s@%s: mysql_native_password", answer.user, host)
        channel.write_packet(ok_packet())
        return answer
    if answer.plugin != CACHING_SHA2:
        # AuthSwitchRequest (page_protocol_connection_phase_packets_protocol_auth_switch_request):
        # 0xfe, plugin name NUL, plugin data (the nonce, NUL-terminated).
        channel.write_packet(b"\xfe" + CACHING_SHA2.encode() + b"\x00" + nonce + b"\x00")
        answer.auth_response = channel.read_packet(CONNECT_TIMEOUT_S)
        answer.plugin = CACHING_SHA2
    scramble = answer.auth_response
    if not scramble:  # an empty password
        if accounts.password:
            raise denied(answer.user, host, False)
        channel.write_packet(ok_packet())
        return answer
    if accounts.cached(answer.user):
        if not caching_sha2_scramble_ok(accounts.stored_hash(), nonce, scramble):
            raise denied(answer.user, host, True)
        log.info("login %s@%s: caching_sha2_password fast authentication", answer.user, host)
        channel.write_packet(b"\x01\x03")  # fast_auth_success
        channel.write_packet(ok_packet())
        return answer
    channel.write_packet(b"\x01\x04")  # perform_full_authentication
    reply = channel.read_packet(CONNECT_TIMEOUT_S)
    if secure:  # over TLS the client sends the password itself, NUL-terminated
        password: bytes | None = reply[:-1] if reply.endswith(b"\x00") else reply
    else:
        if reply == b"\x02":  # request_public_key
            channel.write_packet(b"\x01" + accounts.public_pem)
            reply = channel.read_packet(CONNECT_TIMEOUT_S)
        password = accounts.decrypt(reply, nonce)
    if password is None or not hmac.compare_digest(password, accounts.password.encode()):
        raise denied(answer.user, host, True)
    accounts.remember(answer.user)
    how = "over TLS" if secure else "RSA key exchange"
    log.info("login %s@%s: caching_sha2_password full authentication (%s)", answer.user, host, how)
    channel.write_packet(ok_packet())
    return answer
