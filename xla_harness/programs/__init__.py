"""Model families the harness stresses."""
