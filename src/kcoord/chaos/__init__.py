"""The chaos lab: namespaces, nemeses, workloads, histories and checkers. May import everything."""
