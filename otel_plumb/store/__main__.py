"""The store's writer process (started by ``StoreWriter``): ``python -m otel_plumb.store PATH
MAX_AGE MAX_BYTES``, frames of records on standard input, answers on standard output."""

import os
import sys

from otel_plumb.store.writer import serve

# Answers go to the processor on the original standard output; anything else printed (a
# library's warning) goes to standard error, never into the answers.
answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
serve(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.stdin.fileno(), answers)
