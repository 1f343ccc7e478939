"""Main's buffers, before and after bufferization."""
