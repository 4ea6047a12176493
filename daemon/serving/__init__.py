"""Serving code both roles use: the collector (the door of every connection) and the
inference role (the owner of every serving connection). It imports neither role.

- ``deadlines``: the time limits of a connection's frames and replies (one rule);
- ``channel``: the collector <-> inference datagram channel (handing connections over);
- ``fds``: handing file descriptors to a stream peer after what was written before.
"""
