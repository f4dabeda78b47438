from edge_sdk.cli import main

main()
