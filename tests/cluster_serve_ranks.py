"""What each rank runs in the sharded-serving tests: `mlx-spec serve ARGS` as is ("as-is"), or with a broken version
where the ranks other than 0 do not replay rank 0's admissions ("no-admit") or its cancellations ("no-cancel")."""

import sys

from mlx_spec import cli

AS_IS, NO_ADMIT, NO_CANCEL = "as-is", "no-admit", "no-cancel"


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
    if mode in (NO_ADMIT, NO_CANCEL):
        dropping("admitted" if mode == NO_ADMIT else "cancelled")
    sys.argv = ["mlx-spec", "serve", *args]
    cli.main()
