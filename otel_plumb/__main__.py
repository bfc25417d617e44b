from otel_plumb.cli.main import main

main()
