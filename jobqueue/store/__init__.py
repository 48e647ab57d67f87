"""Redis: key names, the Lua scripts and their contract, the calls built from it and
their replies, connections from URLs, the embedded server."""
