"""Bytes on the wire: uvicorn's protocol towards clients (protocol.py, with the direct lane's
request cycle in cycle.py) and the HTTP/1.1 client towards upstreams (client.py)."""
