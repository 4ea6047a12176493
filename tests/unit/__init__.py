"""Tier 1: pure units (and shm segments between processes); no daemon is started."""
