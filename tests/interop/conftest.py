"""What the Hugging Face parity tests of the recurrent LMs share: quiet transformers, and one check that greedy
generation and every decoding step's logits equal HF's cached decoding."""

import logging

import pytest
import torch


@pytest.fixture
def quiet_transformers():
    transformers = pytest.importorskip("transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()


@pytest.fixture
def same_decoding():
    """``check(hf, ours, vocab_size)``: from a random 2 x 6 prompt, 24 greedy tokens equal to HF's ``generate``
    (and varied, so that equal sequences mean something), and ours' O(1) ``step`` logits at every position equal
    to HF's cached decoding's (1e-4)."""

    def check(hf, ours, vocab_size: int, new: int = 24) -> None:
        prompt = torch.randint(1, vocab_size, (2, 6))
        out = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        mine = ours.generate(prompt, new, temperature=0)
        assert torch.equal(mine, out.sequences)
        assert len(set(mine[0, 6:].tolist())) > 5
        logits, state = ours(prompt, return_state=True)
        steps = [logits[:, -1]]
        with torch.no_grad():
            for i in range(new - 1):
                y, state = ours.step(mine[:, 6 + i], state)
                steps.append(y)
        torch.testing.assert_close(torch.stack(steps, 1), torch.stack(out.logits, 1), atol=1e-4, rtol=1e-4)

    return check
