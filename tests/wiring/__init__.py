"""Tier 2: every role on the real wiring, in one process (``daemon.inprocess.InProcessDaemon``)."""
