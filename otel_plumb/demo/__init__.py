"""The bundled demo: an instrumented accounts-payable agent, its policy, and a stand-in tracing backend."""
