"""The protocol both sides speak, declared once and imported by client and daemon alike.

``codec`` (RLlink frames and messages, sans-IO), ``spaces`` (space JSON forms,
validation, features), ``policy_spec`` (the network description: flat weight layout,
numpy forward, ONNX graph), ``records`` (episode fragments <-> shared-memory step
records) and ``discovery`` (where a local daemon announces itself). It lives inside
``client_lib`` because the client must stay light (numpy, orjson; never torch, never
the daemon): the daemon imports it from here, never the other way round.
"""
