"""What a served bench needs of the web app's server: the face that owns the server implements `Host`."""

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from mlx_spec.named import Log


class Loaded(Protocol):
    """A target (and the drafters' models) loaded once for every server a run starts."""

    target: Any  # the mlx-lm model
    tokenizer: Any

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """The prompt's token ids as the server templates a chat."""
        ...

    def check_draft(self, spec: str) -> str | None:
        """Refuse (raise) a drafter a request could not pick."""
        ...


L = TypeVar("L", bound=Loaded)


class Host(Protocol[L]):
    """Loads a pair and starts servers on it, on loopback, in this process."""

    def load(self, model: str, draft: str, *, num_draft: int | None, more: Sequence[str], log: Log) -> L:
        """The target with `draft` as its drafter and the models `more` names loaded beside it."""
        ...

    def plain(self, loaded: L) -> L:
        """The same weights with no drafter."""
        ...

    def start(self, loaded: L, **options: Any) -> AbstractContextManager[str]:
        """A server on `loaded` (options as `mlx-spec serve` names them); entering it gives its URL."""
        ...
