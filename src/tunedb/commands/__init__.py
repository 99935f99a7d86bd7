"""Thin CLI front-ends: one module per `tunedb` subcommand, each with configure(parser) and run(args).

They parse flags, call the stage modules, and print; no stage logic lives here.
"""
