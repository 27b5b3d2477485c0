from mtx.cli import main

main()
