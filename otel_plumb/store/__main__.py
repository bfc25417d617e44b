"""The store's writer process (started by ``StoreWriter``): ``python -m otel_plumb.store PATH
MAX_AGE MAX_BYTES``, frames of records on standard input, answers on standard output."""

import sys

from otel_plumb.store.writer import serve

serve(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.stdin.fileno(), sys.stdout.buffer)
