"""Compiles allowed flow sets into device rule sets (DOCA Flow, NVUE, Linux). Filled by a later issue."""
