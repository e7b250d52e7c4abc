"""The storage nodes' raw TCP fetch port: its framing (``protocol``) and an asyncio client.

Shared because both sides use it: storage nodes serve it (``storage_node/fetch/server.py``),
gateways and tools read through it.
"""
