"""The target's own MTP layers draft from its last state: each context token is fed beside the target's state of the
position before it (after the target's final norm), each draft token beside the MTP module's own output before it."""

import mlx.core as mx

from .eagle3 import Eagle3Drafter


class MTPDrafter(Eagle3Drafter):
    """Drafts with a `models.mtp.MTP` module in its own cache, over the whole target vocabulary; the states it is shown
    are those of the target's last block, normed as the target's output layer reads them."""

    name = "mtp"
    trees = False

    def __init__(self, module, blocks: int, vocab_size: int, real_vocab: int | None = None):
        super(Eagle3Drafter, self).__init__(module, vocab_size, real_vocab)
        self.head, self.subset = None, False
        self.reads, self.width, self.held = (blocks - 1,), module.fc.weight.shape[0], []

    def see(self, at: int, states: mx.array) -> None:
        super().see(at, self.model.target_norm(states))

    def full(self, h: mx.array) -> mx.array:
        return super(Eagle3Drafter, self).full(self.model.logits(h))

    def greedy(self, h: mx.array) -> mx.array:
        return mx.argmax(self.full(h), axis=-1)
