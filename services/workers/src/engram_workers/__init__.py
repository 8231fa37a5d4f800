"""Engram's workers.

gRPC's fork handlers are switched off before any worker loads gRPC: a worker forks only
to run a program (the mirror's ``git``), and with the handlers on, a fork while another
thread of the process is inside gRPC (the norm when every worker shares one process)
can crash the child before it runs the program (``git add`` died with SIGSEGV). A value
the operator set is kept.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
