"""The process's own plumbing: its child processes (subproc), the signals it was sent (interrupts),
the files it reads (files) and where it finds its own data (resources)."""
