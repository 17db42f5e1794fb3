"""``syvain-data demo``: runs the README's main job (:func:`syvain_training_data.demo.run_demo`)."""

from __future__ import annotations

from syvain_training_data.cli.context import Context


def demo_command(ctx: Context) -> None:
    from syvain_training_data.demo import run_demo

    run_demo(ctx.args.root, ctx.args.records, s3=ctx.args.s3)
