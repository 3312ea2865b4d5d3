"""Who may talk to a node: TLS contexts and certificates, the cluster token, and the
authenticated channel they make."""
