"""Serving code both shells of a serving connection use: the collector (TCP and Unix
sockets) and the inference role (direct connections). It imports neither role.

- ``front``: serving messages in, lane requests out, replies back;
- ``deadlines``: the time limits of a connection's frames and replies (both owners' one rule);
- ``channel``: the collector <-> inference datagram channel (handing connections over);
- ``fds``: handing file descriptors to a stream peer after what was written before.
"""
