"""Option dataclasses of the learning commands (the trainer's config, the PPO expert, inference-time stochastic
attention), kept apart from the code that runs them so that their `--help` loads no torch (drive/cli.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from agents.checks import at_least, in_range, one_of, positive
from drive.options import (
    MAX_WORKERS,
    IntRange,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Probability,
)


@dataclass(frozen=True)
class PPOExpertOptions:
    run_dir: Path = Path("runs/expert_ppo")
    """Run directory: config, evaluation curve, resumable SB3 state, best checkpoint."""
    out: Path | None = None
    """Where the best held-out checkpoint is exported (our format); default RUN_DIR/expert.pt, never the shipped
    checkpoints/expert_ppo.pt, so a new run cannot overwrite it by accident."""
    total_steps: PositiveInt = 3_000_000
    """Environment steps to train for (all workers together)."""
    n_envs: PositiveInt = 2
    """Parallel training environments (SubprocVecEnv when > 1)."""
    seed: NonNegativeInt = 0
    """Seed for PPO and the training workers' track streams."""
    resume: bool = False
    """Continue a killed run from its last evaluation (run_dir/sb3_last.zip, vecnorm_last.pkl, eval.json)."""
    eval_every: PositiveInt = 250_000
    """Evaluate (and maybe keep) the deterministic policy every this many steps."""
    eval_seeds: str = "5000-5049"
    """Held-out track seeds for selection, as 'a-b' (inclusive) or 'a,b,c'. Never use 1000-1019 here."""
    min_weight: NonNegativeFloat = 0.5
    """Selection score = mean return + min_weight * min return over the held-out seeds."""
    offtrack_patience: NonNegativeInt = 60
    """Training only: end an episode after this many consecutive steps with no wheel on the road (0 = never)."""
    offtrack_penalty: NonNegativeFloat = 100.0
    """Training only: reward subtracted when an episode is ended for being off track."""
    perturb_prob: Probability = 0.25
    """Training only: chance an episode starts at a random track point, heading and lateral offset (recoveries)."""
    wheel_off_penalty: NonNegativeFloat = 0.02
    """Training only: reward subtracted per step for each wheel off the road (discourages cutting corners)."""
    lr: PositiveFloat = 3e-4
    """Initial learning rate, decayed linearly to lr_final."""
    lr_final: PositiveFloat = 3e-5
    """Learning rate at the end of training."""
    n_steps: PositiveInt = 1024
    """Rollout length per environment between updates."""
    batch_size: int = 256
    """Minibatch size."""
    n_epochs: int = 5
    """Passes over each rollout."""
    gamma: float = 0.995
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    clip_range: float = 0.2
    """PPO clip range."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    log_std_init: float = -1.0
    """Initial log standard deviation of the Gaussian policy."""
    use_sde: bool = True
    """Generalised state-dependent exploration (smoother exploration than per-step noise)."""
    hidden: tuple[int, ...] = (128, 128)
    """Hidden widths of the policy and value MLPs."""
    action_mode: str = "speed"
    """Pedal axis of the policy: 'speed' (target speed tracked by a servo) or 'accel' (gas/brake directly)."""
    brake_scale: float = 0.8
    """Largest brake the policy can apply (0.9 and above locks the wheels)."""


@dataclass(frozen=True)
class SAOptions:
    ckpt: Path
    """controller checkpoint (`drive train` on any task; the controller must have attention SA can reach)"""
    frames: NonNegativeInt = 1024
    """calibration inputs: the validation split subsampled evenly to this many (0 = all)"""
    passes: IntRange(2) = 8
    """stochastic SA passes M per evaluation of nu, for the test predictive with SA, and the saved controller's
    default sample count"""
    seed: NonNegativeInt = 0
    """seed of the SA resampling (common random numbers) and of the Thompson draws"""
    batch_size: PositiveInt = 512
    """inputs per encoder batch and per SA forward chunk (bounds memory)"""
    progress: bool = True
    """show a progress bar over the Bayesian-optimisation evaluations"""
    data: Path | None = None
    """the checkpoint's data when it is not where its fingerprint says (a fresh clone): demonstrations regenerated
    by `drive collect` (the error names the command), or a task's data root"""
    head_variance: bool = True
    """the saved SA controller's aleatoric variance is the head's predicted noise (sa.json test.with_sa_plus_head);
    --no-head-variance: 0, SA's spread alone (test.with_sa)"""


@dataclass(frozen=True)
class DensityOptions:
    ckpt: Path
    """a trained controller's checkpoint (`drive train`, any controller with an encoder)"""
    out: Path = Path("out/density")
    """output directory for density.json and density_controller.pt"""
    frames: NonNegativeInt = 8192
    """inputs of the training split the density is fitted on, and of the validation split that sets its scale,
    each subsampled evenly to this many (0 = all)"""
    batch_size: PositiveInt = 512
    """inputs per encoder batch (bounds memory)"""
    data: Path | None = None
    """the checkpoint's data when it is not where its fingerprint says (as `drive sa calibrate --data`)"""


SELECT = ("val_nll", "val_mse")  # the validation score that picks best.pt and stops early


@dataclass(frozen=True)
class TrainerConfig:
    LABEL: ClassVar[str] = "trainer"  # errors name fields as `--set trainer.KEY` does

    epochs: int = 20
    """maximum number of epochs"""
    batch_size: int = 128
    """minibatch size"""
    lr: float = 1e-3
    """AdamW learning rate"""
    weight_decay: float = 1e-4
    """AdamW weight decay"""
    schedule: str = "cosine"
    """learning-rate schedule: cosine (anneal to 0 over `epochs`, per step) or constant"""
    grad_clip: float = 1.0
    """clip the global gradient norm to this value (0 disables)"""
    patience: int = 10
    """stop after this many epochs without a better `select` score (0 disables early stopping)"""
    select: str = "val_nll"
    """the validation score best.pt and early stopping follow: val_nll (predictive Gaussian NLL) or val_mse (the
    mean's squared error: where held-out NLL rises with confidence while the mean still improves)"""
    seed: int = 0
    """seed for batch order, the model's sampling and validation draws"""
    val_samples: int = 0
    """stochastic samples per validation prediction (0: the controller's default)"""
    device: str = "cpu"
    """torch device (cpu, cuda)"""
    num_workers: int = 0
    """DataLoader worker processes for datasets without a `tensors` fast path"""
    resume: bool = False
    """continue from run_dir/resume.pt"""
    progress: bool = True
    """show a progress bar"""
    tensorboard: bool = True
    """write TensorBoard scalars to run_dir/tb"""

    def __post_init__(self) -> None:
        at_least(self, 1, "epochs", "batch_size")
        positive(self, "lr")
        at_least(self, 0, "weight_decay", "grad_clip", "patience", "seed", "val_samples")
        in_range(self, "num_workers", 0, MAX_WORKERS)
        one_of(self, "schedule", ("cosine", "constant"))
        one_of(self, "select", SELECT)
