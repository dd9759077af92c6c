"""The environment a test hands to the processes it starts, as a user's shell would have it."""
import os

# Variables by which Lightning (or torch.distributed) would take a new process for a rank of
# another launcher (torchrun, SLURM, MPI, ...), or point it at another run's rendezvous: an
# in-process fit earlier in the same pytest worker leaves MASTER_PORT behind, its store still
# listening on that port.
FOREIGN = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
           "MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED", "TORCHELASTIC_RUN_ID")
FOREIGN_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "LSB_", "JSM_", "TORCHELASTIC_",
                    "PL_TRAINER_")


def fresh_environment(**updates: str) -> dict:
    """This process's environment without any launcher's variables, with :obj:`updates`."""
    env = {k: v for k, v in os.environ.items()
           if k not in FOREIGN and not k.startswith(FOREIGN_PREFIXES)}
    env.update(updates)
    return env
