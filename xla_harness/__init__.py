"""xla-harness: reproduce, measure and localise intermittent non-finite updates under XLA."""

__version__ = "0.1.0"
