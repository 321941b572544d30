from eaglewire.cli import main

main()
