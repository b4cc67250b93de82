"""What each rank runs in the sharded-serving tests: `mlx-spec serve ARGS` as is ("as-is"), with a planner that drafts
every offer whole ("fixed": what a test asserts of drafting then does not hang on this machine's timings), or with a
broken version where the ranks other than 0 do not replay rank 0's admissions ("no-admit") or its cancellations
("no-cancel")."""

import sys

from mlx_spec import cli

AS_IS, FIXED, NO_ADMIT, NO_CANCEL = "as-is", "fixed", "no-admit", "no-cancel"


def fixed() -> None:
    """The served pair's planner is not adaptive: every round drafts the lookup's whole offer (`Planner.plan`)."""
    from mlx_spec.server import main

    load = main.load_pair

    def loading(*args, **kwargs):
        pair = load(*args, **kwargs)
        pair.adaptive = False
        return pair

    main.load_pair = loading


def dropping(what: str) -> None:
    """The followers take rank 0's steps but drop `what` of them: the requests admitted (their prompts never run
    there) or the requests cancelled (they go on generating there)."""
    from mlx_spec.server import lockstep

    follow = lockstep.Lockstep.follow

    def dropping(self):
        step = follow(self)
        setattr(step, what, [] if what == "admitted" else set())
        return step

    lockstep.Lockstep.follow = dropping  # type: ignore[method-assign]


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == FIXED:
        fixed()
    if mode in (NO_ADMIT, NO_CANCEL):
        dropping("admitted" if mode == NO_ADMIT else "cancelled")
    sys.argv = ["mlx-spec", "serve", *args]
    cli.main()
