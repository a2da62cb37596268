from chatstate.cli import main

main()
