"""Tier 3: real processes: ``rlinkd serve`` started, signalled, its children killed."""
