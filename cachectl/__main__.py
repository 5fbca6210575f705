import gc

gc.disable()  # start-up makes no garbage worth a collection; main() and the command manage the collector

from .cli import main  # noqa: E402

main()
