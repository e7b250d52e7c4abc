"""The gateway's raw data protocol: produce and fetch frames for the Python SDK (``protocol``).

Shared because both sides use it: the gateway serves it (``gateway/server/data_listener.py``),
the SDK speaks it (``gateway/client/dataport.py``).
"""
