"""From source events to committed transactions: assembly at the commit event, XA, statement-logged writes, the feed the relay reads."""
