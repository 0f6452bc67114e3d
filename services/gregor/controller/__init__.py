"""The controller: one active instance owns cluster metadata, elects partition leaders and tracks brokers (seed 001)."""
