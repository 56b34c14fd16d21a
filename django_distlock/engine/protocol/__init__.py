"""The protocol, free of I/O: the Lua scripts, the steps of every operation, what they
ask of the drivers, the replies read back, and a hold with its owner. The room below
the transport: nothing here talks to Redis."""
