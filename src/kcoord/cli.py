"""The ``kcoord`` console script: ``chaos`` goes to the chaos suite, ``pipeline`` to the Spark
pipeline, everything else to the node's command line (``kcoord.node.cli``), which may not
import the layers above it.

  kcoord chaos run|clean ...    the chaos suite (kcoord.chaos.runner)
  kcoord pipeline ...           the Spark pipeline (kcoord.pipeline.cli)
  kcoord <anything else>        node, cluster, quorum, dump-log, groups, topics (kcoord.node.cli)
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "chaos":
        from kcoord.chaos.runner import main as chaos_main

        return chaos_main(args[1:])
    if args and args[0] == "pipeline":
        from kcoord.pipeline.cli import main as pipeline_main

        return pipeline_main(args[1:])
    from kcoord.node.cli import main as node_main

    return node_main(args)


if __name__ == "__main__":
    sys.exit(main())
