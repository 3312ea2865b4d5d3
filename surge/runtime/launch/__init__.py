"""Starting node agents: local processes, network namespaces, Ray actors."""
