"""One adapter per outside service; each takes its client and speaks in domain outcomes."""
