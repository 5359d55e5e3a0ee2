"""The node process, the imperative shell: config, listeners, RPC, runtime, CLI.

The only package that owns sockets, tasks, files of its own and clocks (``clock``). It may
import ``cluster``, ``raft`` and ``storage``; nothing below imports it.
"""
