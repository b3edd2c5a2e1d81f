from habu.cli import main

main()
