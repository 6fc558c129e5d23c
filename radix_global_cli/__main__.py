import sys

from radix_global_cli import main

sys.exit(main())
