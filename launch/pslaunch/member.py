"""A fleet's member (one logical process) and the error that names the member
to blame. fleet.py starts and watches members; elastic.py adds and removes
shard members while the fleet runs."""


class LaunchError(Exception):
    """A process failed: `member` is whom to blame, `reason` says why."""

    def __init__(self, member, reason):
        super().__init__("%s: %s" % (member.name if member else "psrun", reason))
        self.member = member
        self.reason = reason


class Member:
    """One logical process (role, rank); `proc` is its current incarnation.
    Shards of a replicated fleet are replica `replica` of group `group`
    (rank = group * replicas + replica, the process index)."""

    def __init__(self, role, rank, group=None, replica=None):
        self.role = role
        self.rank = rank
        self.group = rank if group is None else group
        self.replica = replica
        self.name = ("%s-%d" % (role, rank) if replica is None
                     else "%s-%d-r%d" % (role, self.group, replica))
        self.proc = None
        self.endpoint = None
        self.restarts = 0
        self.done = False
        self.history = []  # exit descriptions of earlier incarnations
        # The process index spawn() places it by (servers first, then
        # workers); None: its rank. psrun --elastic gives a new shard the
        # next index after every process started so far.
        self.index = None
