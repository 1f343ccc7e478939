"""Which nodes can be compiled: the converter registry, its dtype table, the built-in
converters by op family and users' own converters."""
