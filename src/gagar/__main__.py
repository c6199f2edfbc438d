from gagar.cli import main

main()
