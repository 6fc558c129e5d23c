"""Command-line entry points: ``main.py`` (``radix-global router``) and ``status.py``
(``radix-global status``). May import anything in ``router``; nothing imports them.
"""
