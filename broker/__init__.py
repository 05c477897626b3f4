"""plugbroker: an AMQP 0-9-1 broker whose policies are pluggy plugins."""

__version__ = "0.1.0"
