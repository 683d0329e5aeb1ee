"""AdamW for PCP: decoupled weight decay, bias correction, global-norm clipping,
linear warmup then cosine decay. Built on optax; step for step it matches
`torch.nn.utils.clip_grad_norm_` followed by `torch.optim.AdamW` with the same
learning rate schedule. Weight decay applies to matrices only (ndim >= 2), as in
nanoGPT: biases, norms' gains are not decayed.
"""

from pcp_core import hookimpl
from pcp_core.optimizers import (
    GradientTransformation,
    InnerOptimizer,
    InnerSettings,
    clipped,
    learning_rate,
)

PCP_PLUGIN_API = 4  # the pcp_core.PLUGIN_API this plugin is written for


def build(settings: InnerSettings) -> GradientTransformation:
    import jax
    import optax

    def decay_mask(params):
        return jax.tree_util.tree_map(lambda p: p.ndim >= 2, params)

    adamw = optax.adamw(
        learning_rate=learning_rate(settings),
        b1=settings.beta1,
        b2=settings.beta2,
        eps=settings.eps,
        weight_decay=settings.weight_decay,
        mask=decay_mask,
    )
    return clipped(settings, adamw)


ADAMW = InnerOptimizer(name="adamw", build=build, description="AdamW with warmup + cosine decay")


@hookimpl
def pcp_register_optimizers(register) -> None:
    register(ADAMW)
