//! Every `RUSTCCL_*` setting with its default and meaning: what
//! `rustccl.config()` and the README's settings table show (a test checks
//! that each one is read by `Config` and each one read is here).

/// One documented setting: name, default, meaning.
pub struct SettingDoc {
    pub name: &'static str,
    pub kind: Kind,
    pub default: &'static str,
    pub doc: &'static str,
}

/// Who a setting is for (the settings page lists them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// What a user chooses: transport, TLS, features, diagnostics.
    Use,
    /// What the rules fitted per host choose (the tuning rules, the
    /// algorithm thresholds): for experiments, and for a case the rules
    /// get wrong.
    Tuning,
    /// For rustccl's own tests and profiling.
    Debug,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Use => "use",
            Kind::Tuning => "tuning",
            Kind::Debug => "debug",
        }
    }
}

pub const SETTINGS: &[SettingDoc] = &[
    SettingDoc {
        name: "RUSTCCL_SMALL_ALLREDUCE_BYTES",
        kind: Kind::Tuning,
        default: "65536",
        doc: "CPU all_reduce up to this size uses recursive doubling; larger ones the pipelined ring",
    },
    SettingDoc {
        name: "RUSTCCL_SMALL_BROADCAST_BYTES",
        kind: Kind::Tuning,
        default: "262144",
        doc: "CPU broadcast up to this size uses a binomial tree; larger ones a pipelined chain",
    },
    SettingDoc {
        name: "RUSTCCL_SEGMENT_BYTES",
        kind: Kind::Tuning,
        default: "524288",
        doc: "largest piece a ring or chain step puts on a link at once",
    },
    SettingDoc {
        name: "RUSTCCL_CALLER_RUNS_US",
        kind: Kind::Tuning,
        default: "10000",
        doc: "a blocking CPU collective (torch's async_op=False) runs on the calling thread (no hand-off between threads): at once if the engine is idle, else it waits up to this long in the queue for its caller's wait() to run it before rustccl's worker thread runs it (at most 10 s); a wait that sleeps (the engine is busy with earlier work) or has a timeout hands it to the worker at once; 0: the worker runs every collective",
    },
    SettingDoc {
        name: "RUSTCCL_TRANSPORT",
        kind: Kind::Use,
        default: "auto",
        doc: "auto: shared memory between ranks of one host, TCP between hosts; tcp or shm force one (same value on every rank)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_RING_BYTES",
        kind: Kind::Tuning,
        default: "1048576",
        doc: "bytes of each shared-memory ring between two ranks (per direction)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_SMALL_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "all_reduce up to this size over shared memory uses one round (every rank reduces all peers' copies); auto (or 0): the core's L2 cache / ranks on the host, 32 KiB to 256 KiB",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_SEGMENT_BYTES",
        kind: Kind::Tuning,
        default: "262144",
        doc: "piece of each rank's chunk moved per round (per thread) by the pipelined shared-memory all_reduce; a rank's input and output slots hold this x its threads, at least RUSTCCL_SHM_SLOT_MIN_BYTES",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_SLOT_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "smallest shared-memory input / output slot of a rank (RUSTCCL_SHM_SEGMENT_BYTES x threads where larger); auto: 2097152 with 2 local ranks, or 3-4 of 4 threads or more (a scatter's 2 MiB blocks and an all_reduce's 2 MiB chunks then take one slot, one round: fewer phase waits, each a sleep and a wake-up where the cores are taken; 3-4 ranks of fewer threads keep theirs, so that their segments fit a container's default 64 MiB /dev/shm), else none; 0: none; stats()[\"thresholds\"][\"shm_slot_bytes\"]",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_THREADS",
        kind: Kind::Tuning,
        default: "auto",
        doc: "threads each rank uses for its copies and reductions in the shared-memory all_reduce; auto (or 0): cores / ranks on the host, 1 to 8",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_ATTACH_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "all_reduce, reduce_scatter, all_gather and reduce between ranks of one host on buffers of at least this many bytes read the peers' tensors directly (cross-memory attach: one copy instead of two); all_to_all, gather and scatter blocks over RUSTCCL_SHM_BLOCK_READ_MIN_BYTES and point-to-point sends over RUSTCCL_SHM_SINGLE_READER_MIN_BYTES (256 KiB by default; or from this size, if smaller) do too (such a send completes once its receive took the data); off: never (also skips the setup probe); auto: 16777216 (all_reduce: 4 MiB per local rank, at least that) where a rank has two or more threads (cores / local ranks), or where one thread reads another process's memory at least 0.8x as fast as it copies its own (measured at setup); else never for these collectives (but from 4194304 with 2 local ranks; reduce, where roots take pushes, from 524288 with more than 8 local ranks: RUSTCCL_SHM_GATHER_PUSH; single-reader transfers: RUSTCCL_SHM_SINGLE_READER_MIN_BYTES); with more than 8 local ranks of at most 2 threads, all_reduce from 16777216 and reduce_scatter from 8388608 whether reads are fast or slow (many readers beat the slots' copies there); a value set applies to all_reduce, reduce_scatter, all_gather and reduce too (but where their own RUSTCCL_SHM_<OP>_ATTACH_MIN_BYTES is set); with shared tensors (RUSTCCL_SHM_TENSORS=1) auto is 262144 (all_reduce 4194304, reduce 16777216 with up to 4 local ranks, all_reduce 8388608 and all_gather 16777216 with 8 or more local ranks of 32 or more threads among them)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_ALL_REDUCE_ATTACH_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "all_reduce alone: the smallest buffer that reads the peers' tensors directly (cross-memory attach, unless RUSTCCL_SHM_ATTACH_MIN_BYTES is off); off: never; auto: as RUSTCCL_SHM_ATTACH_MIN_BYTES says for all_reduce. The tuner (python -m rustccl.tune) chooses it per host, apart from the other collectives: where one op's crossover lies elsewhere than another's, one shared threshold would leave one of them slower",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_ALL_GATHER_ATTACH_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "all_gather alone (bytes per rank), as RUSTCCL_SHM_ALL_REDUCE_ATTACH_MIN_BYTES",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_REDUCE_SCATTER_ATTACH_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "reduce_scatter alone (bytes of its input), as RUSTCCL_SHM_ALL_REDUCE_ATTACH_MIN_BYTES",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_REDUCE_ATTACH_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "reduce alone (bytes per rank), as RUSTCCL_SHM_ALL_REDUCE_ATTACH_MIN_BYTES",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_SINGLE_READER_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "all_to_all, gather and scatter blocks and point-to-point messages to a rank of the host of more than this many bytes are read from the sender's tensor (cross-memory attach, unless RUSTCCL_SHM_ATTACH_MIN_BYTES is off); auto (or 0): 262144, also where the host's reads are slow (see RUSTCCL_SHM_ATTACH_MIN_BYTES=auto): a gather's or scatter's copies then spread over every rank instead of all falling to the root, and such sends are read, not staged; where reads are slow, smaller all_to_all blocks go through the senders' slots (all_to_all always runs the single-copy algorithm) and gathers and scatters of smaller blocks go as messages",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_BLOCK_READ_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "all_to_all, gather and scatter blocks between ranks of one host of more than this many bytes are read from the sender's tensor (cross-memory attach); smaller ones are copied through the sender's shared-memory input slots (one per local rank, RUSTCCL_SHM_SEGMENT_BYTES x threads each; a block takes one, or both with 2 local ranks: RUSTCCL_SHM_SLOT_MIN_BYTES); auto (or 0): 2097152 (or RUSTCCL_SHM_SINGLE_READER_MIN_BYTES if larger) where reads are fast and the host has 3 or 4 local ranks, 4194304 with 2, else RUSTCCL_SHM_SINGLE_READER_MIN_BYTES, except scatter's blocks, read over 16384, and gather's, pushed into the root over 65536, with more than 8 local ranks where no collective reads (one thread a rank: otherwise the root's one thread copies every block; stats()[\"thresholds\"][\"shm_scatter_block_read_min_bytes\"], [\"shm_gather_block_read_min_bytes\"]); with shared tensors (RUSTCCL_SHM_TENSORS=1, read with a plain copy) 32768 with more than 4 local ranks, else 262144",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_MIN_PIECE_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "smallest piece of a shared-memory copy a rank's worker threads take (the threads are woken only for at least two such pieces: a wake-up costs about as much as copying one); the reducing algorithms (pipelined all_reduce and reduce, reduce_scatter) take pieces half that size; auto (or 0): 262144, or RUSTCCL_SHM_SEGMENT_BYTES when smaller",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_ROOT_THREADS",
        kind: Kind::Tuning,
        default: "auto",
        doc: "threads a root uses between ranks of one host in the phases only it works in (gather's and reduce's reads of the other ranks' blocks, scatter's copies into its shared memory) while the other ranks wait, when the phase has more pieces (RUSTCCL_SHM_MIN_PIECE_BYTES) than the rank's own threads; auto (or 0): the cores not left to the other local ranks, at least RUSTCCL_SHM_THREADS' count and at most 8",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_QUICK_THREADS",
        kind: Kind::Tuning,
        default: "auto",
        doc: "threads (the caller's included) of a rank's quick team: a second, small set of worker threads that spin 200 us when idle and take the parallel phases of up to 256 KiB per thread (RUSTCCL_SHM_QUICK_BYTES_PER_THREAD; a reduction of n ranks' copies counts n times its bytes), where the rank's own workers (RUSTCCL_SHM_THREADS) sleep when idle because the local ranks' threads take more than a quarter of the cores (waking them costs tens of microseconds a phase on a VM); larger phases go to the workers (led by the team with up to 4 local ranks: RUSTCCL_SHM_QUICK_LEADS). auto: a quarter of the cores shared among the local ranks, at most RUSTCCL_SHM_THREADS, none below 2 (but 2 for a share of 1 with 16 or more local ranks, where every phase waits for the rank whose workers woke last), and none where the workers spin themselves or RUSTCCL_SHM_SPIN_US is set; 0: none",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_QUICK_BYTES_PER_THREAD",
        kind: Kind::Tuning,
        default: "auto",
        doc: "the largest parallel phase a rank's quick team (RUSTCCL_SHM_QUICK_THREADS) takes, per thread of the team (a reduction of n ranks' copies counts n times its bytes); larger phases run on the rank's own workers; auto (or 0): 262144",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_QUICK_ALL_TO_ALL_BYTES_PER_THREAD",
        kind: Kind::Tuning,
        default: "auto",
        doc: "as RUSTCCL_SHM_QUICK_BYTES_PER_THREAD, for all_to_all's copies of its blocks into and out of the shared slots; auto (or 0): RUSTCCL_SHM_QUICK_BYTES_PER_THREAD's where the quick team leads the larger phases (RUSTCCL_SHM_QUICK_LEADS), else 1048576 (sent to sleeping workers, every rank waits for the one whose workers woke last)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_QUICK_MIN_PIECE_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "smallest piece of a phase the quick team (RUSTCCL_SHM_QUICK_THREADS) takes, the team woken only for at least two (a reduction's pieces are 1/n of it, n local ranks); its threads spin, so a piece need not pay for a wake-up; auto (or 0): 32768, or RUSTCCL_SHM_MIN_PIECE_BYTES when smaller",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_QUICK_LEADS",
        kind: Kind::Tuning,
        default: "auto",
        doc: "1: a parallel phase too large for the quick team (RUSTCCL_SHM_QUICK_THREADS) starts on it at once while the rank's sleeping workers wake, and the workers that woke before its last piece was taken join it; the phase ends without waiting for the others (the workers then run as a team that sleeps at once when idle, instead of rayon's pool, whose scope waits for every thread it woke); all_to_all's copies are then led from RUSTCCL_SHM_QUICK_BYTES_PER_THREAD too; 0: such phases run on the workers alone; auto: with at most 4 local ranks (with more, every core is a worker's and the team does worse); stats()[\"thresholds\"][\"shm_quick_leads\"]",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_SPIN_US",
        kind: Kind::Tuning,
        default: "auto",
        doc: "microseconds a rank's idle shared-memory worker threads spin (yielding every few dozen looks) waiting for the next piece of work, and the calling thread for their last piece, before they yield 32 times and sleep; 0: no spin (rayon's pool: its idle threads look for work a few dozen times, yielding, and sleep); auto: 200 where the local ranks' threads (RUSTCCL_SHM_THREADS) take at most a quarter of the host's cores, else 0 (spinning threads on busy cores, or ones a hypervisor takes away, cost far more than the wake-ups they save)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_WAIT_SPIN_US",
        kind: Kind::Tuning,
        default: "auto",
        doc: "microseconds a rank's waiting thread polls for its local peers (their phases, or their rings), yielding its core between looks, before it sleeps on its futex word (a wait for the peers' phases first spins 3 us without yielding, unless the cores are taken); auto: 60, growing after a wait that slept and still ended within 500 us to a quarter more than that wait (at most 500) and halving after waits of more than 500 us, where the local ranks have one thread and a core each (a rank per core); 60 where they have worker threads or outnumber the cores, and while links to other hosts are pending too. Waking a sleeper costs tens of microseconds on a VM: where every rank waits a little longer than a fixed window, every phase costs a wake-up and the ranks can stay that far apart; stats()[\"thresholds\"][\"shm_wait_spin_max_us\"] (the most the window grows to)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_BROADCAST_ATTACH_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "broadcast between ranks of one host on buffers of at least this many bytes: every rank reads the root's tensor directly (cross-memory attach, unless RUSTCCL_SHM_ATTACH_MIN_BYTES is off; between two ranks the root writes the second half into the other's buffer meanwhile, where it takes pushes: RUSTCCL_SHM_GATHER_PUSH); off: never, the root's copies into its shared memory and the others' copies out of it run side by side, a quarter of the buffer at a time; auto: off, except 1048576 with shared tensors (RUSTCCL_SHM_TENSORS=1, where the reads are plain copies) and two or more threads a rank, and 1048576 with 2 local ranks where reads are slow and the root takes pushes",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_STAGED_SEND_MIN_BYTES",
        kind: Kind::Tuning,
        default: "131072",
        doc: "see RUSTCCL_SHM_STAGED_SEND_MAX_BYTES: only sends of more than this many bytes are staged, smaller ones that would be read are read from the sender's tensor; 0: every send that would be read is staged when it fits",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_STAGED_SEND_MAX_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "point-to-point sends to a rank of this host that would be read from the sender's tensor (see RUSTCCL_SHM_SINGLE_READER_MIN_BYTES), of more than RUSTCCL_SHM_STAGED_SEND_MIN_BYTES and at most this many bytes, are copied by the sender's threads into a staging area of this size in its shared memory and by the receiver's out of it, chunk by chunk as they land (the send completes once copied in; one such send at a time per rank, the others are read directly); 0: none (and no staging area; none either with RUSTCCL_SHM_ATTACH_MIN_BYTES=off); auto: none for ranks of 1 or 2 threads (RUSTCCL_SHM_THREADS: their copies are too slow for two to pay), else 2 MiB per thread, at most 8 MiB; where /dev/shm cannot hold the staging area, a rank goes without one",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_STAGE_SHARED_SENDS",
        kind: Kind::Tuning,
        default: "0",
        doc: "1: sends of tensors in shared memory (RUSTCCL_SHM_TENSORS=1) are staged as RUSTCCL_SHM_STAGED_SEND_MAX_BYTES says, like other sends; 0: the receiver copies them straight out of the sender's tensor (staging pays with few ranks of many threads, and costs with many ranks)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_GATHER_PUSH",
        kind: Kind::Tuning,
        default: "1",
        doc: "1: a gather's root whose peers' tensors are read through the kernel (no shared arena) posts its outputs, and each rank whose block no shared-memory slot takes writes it there itself (process_vm_writev) while the root copies its own part, instead of the root reading every block; likewise a reduce's root that reads the peers' tensors takes their reduced parts as pushes, and reduce then reads from 4 MiB with 5-8 local ranks of at most 2 threads each, 8 MiB with 5-8 of more threads (or 3-4 of at most 4 threads each) and 512 KiB with more, even where reads are slow; a scatter's root writes the last part (half; 1/n with one thread: RUSTCCL_SHM_SCATTER_ROOT_SHARE) of every block of up to RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES (2 MiB) that its receiver reads; and with RUSTCCL_SHM_SPLIT_SEND_MIN_BYTES=auto this rank splits the sends it receives; 0: the root reads them (decided by the root: ranks may differ)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "a scatter root between ranks of one host that takes pushes (RUSTCCL_SHM_GATHER_PUSH) splits each block its receiver reads from the root's tensor of at most this many bytes: the receiver reads the first half while the root writes the second into the receiver's output; the root decides (its receivers follow what it says in its shared-memory header); any: every size; auto (or 0): 2097152 (on larger blocks the root, writing part of every block, is the slowest)",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_SCATTER_ROOT_SHARE",
        kind: Kind::Tuning,
        default: "auto",
        doc: "a scatter root that splits a block (RUSTCCL_SHM_SCATTER_SPLIT_MAX_BYTES) writes the last 1 / this of it into its receiver's output while the receiver reads the rest; 2-31 (clamped); the root decides and says so in its shared-memory header; auto (or 0): 2 (half), or the number of local ranks where the root has one thread for its solo phases (then it writes as much as each receiver reads); stats()[\"thresholds\"][\"shm_scatter_root_share\"]",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_GATHER_ROOT_SHARE",
        kind: Kind::Tuning,
        default: "auto",
        doc: "a gather root that takes pushes (RUSTCCL_SHM_GATHER_PUSH) reads the last 1 / this of each pushed block from its sender's tensor itself while the sender writes the rest (2-31; values above are clamped), so both copy at once; 1: it reads none; auto (or 0): 4 with 2 local ranks of one thread each (RUSTCCL_SHM_THREADS), else 1; stats()[\"thresholds\"][\"shm_gather_root_share\"]",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_BLOCK_WAIT_US",
        kind: Kind::Tuning,
        default: "20000",
        doc: "an all_to_all, gather or scatter block between ranks of one host that goes through its sender's shared-memory slots is copied out chunk by chunk (16 KiB) as the sender copies it in; a thread waits this long (microseconds) for a chunk before the rank waits for the sender's whole block with the group's timeout, interrupt and dead-peer checks and copies it again (0: at once); stats()[\"thresholds\"][\"shm_block_wait_us\"]",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_SPLIT_SEND_MIN_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "a send to a rank of this host that its receiver reads from the sender's tensor (cross-memory attach: not staged, not by value), of at least this many bytes, is split: the receiver asks the sender for the second half and reads the first while the sender, idle otherwise until the receive took its send, writes the second into the receiver's buffer (process_vm_writev); decided by the receiver; off: never; auto: 524288 where this rank takes pushes (RUSTCCL_SHM_GATHER_PUSH), else off (staged sends are not split: staging beat splitting where it is free); stats()[\"thresholds\"][\"shm_split_send_min_bytes\"]",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_KEEP_APART",
        kind: Kind::Tuning,
        default: "1",
        doc: "1: a thread of a rank polling in a shared-memory wait that has shared its CPU for 15 us with the polling thread of a local rank of lower index moves to an allowed CPU no local rank polls on (its affinity narrowed to that CPU and the user's mask put back at once; at most once per 2 ms; a thread allowed on one CPU never moves). On a kernel whose scheduler lets a yielding thread keep its CPU (EEVDF, Linux 6.6 on), two polling ranks on one CPU see each other's messages about 25 us late: on the 2-core VM small send/recv took 7.5-34 us one way without moves and 7.5-16 with; on the 32-core host nothing moved with 2-4 ranks. 0: no moves",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_TENSORS",
        kind: Kind::Use,
        default: "0",
        doc: "1: import rustccl installs a CPU allocator in torch that takes tensors of RUSTCCL_SHM_TENSORS_MIN_BYTES or more from memory the other ranks of the host map too (a memfd per process, as large as the host's memory but paid for only where used), so collectives and sends between ranks of one host read them with one copy in user space instead of through the kernel (with every local rank so, collectives read from 256 KiB, reduce with up to 4 local ranks from 16 MiB, all_reduce from 4 MiB (from 8 MiB, and all_gather from 16 MiB, with 8 or more local ranks of 32 or more threads among them), broadcast from 1 MiB with two or more threads a rank, blocks as RUSTCCL_SHM_BLOCK_READ_MIN_BYTES says; settings given by hand win); smaller tensors, and tensors made before the import or by numpy, come from torch's own allocator and are read as before. A process forked after (DataLoader workers) keeps its tensors as a private copy-on-write view and allocates from torch's allocator",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_TENSORS_MIN_BYTES",
        kind: Kind::Tuning,
        default: "65536",
        doc: "smallest CPU tensor taken from the shared arena (RUSTCCL_SHM_TENSORS=1); each takes whole 4 KiB pages",
    },
    SettingDoc {
        name: "RUSTCCL_SHM_TENSORS_CACHE_BYTES",
        kind: Kind::Tuning,
        default: "268435456",
        doc: "freed memory of the shared arena (RUSTCCL_SHM_TENSORS=1) kept for the next tensors (peers that mapped its pages read them again without page faults); freed beyond that is given back to the system",
    },
    SettingDoc {
        name: "RUSTCCL_SOCKET_IFNAME",
        kind: Kind::Use,
        default: "",
        doc: "network interface whose address rustccl listens on; default: the interface that reaches the torch store's host",
    },
    SettingDoc {
        name: "RUSTCCL_HOST_ID",
        kind: Kind::Use,
        default: "",
        doc: "overrides the host identity used to find ranks that share a host",
    },
    SettingDoc {
        name: "RUSTCCL_NCCL_LIBRARY",
        kind: Kind::Use,
        default: "",
        doc: "path of the libnccl to load; default: libnccl.so.2 (the one torch loaded)",
    },
    SettingDoc {
        name: "RUSTCCL_CUDA_TIMING",
        kind: Kind::Use,
        default: "0",
        doc: "1: time every CUDA collective on the device (CUDA events) for rustccl.stats(); off by default, as torch's NCCL backend",
    },
    SettingDoc {
        name: "RUSTCCL_HOST_PROFILE",
        kind: Kind::Debug,
        default: "0",
        doc: "1: sum the host time of rustccl's spans of each call (C ABI submit, engine, driver calls, completion callbacks, waits, shared-memory phase waits) for rustccl._rustccl._host_profile() (benchmarks/cuda_probe.py, cpu_small_latency.py, p2p_latency_parts.py)",
    },
    SettingDoc {
        name: "RUSTCCL_CUSTOM_ALLREDUCE",
        kind: Kind::Use,
        default: "1",
        doc: "1: CUDA all_reduce, all_gather_into_tensor and reduce_scatter_tensor of small and medium tensors on GPUs that reach each other over NVLink run rustccl's kernels (one-shot, two-shot, copy) instead of NCCL; 0: always NCCL",
    },
    SettingDoc {
        name: "RUSTCCL_CUSTOM_ALLREDUCE_MAX_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "largest CUDA all_reduce (bytes) that takes rustccl's NVLink kernels (one-shot, then two-shot), also the size of each rank's two registered buffers; auto: see README (where they stop beating NCCL on H200 NVLink)",
    },
    SettingDoc {
        name: "RUSTCCL_ONE_SHOT_MAX_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "largest CUDA all_reduce (bytes) that takes the one-shot kernel; larger ones up to RUSTCCL_CUSTOM_ALLREDUCE_MAX_BYTES take the two-shot kernel; auto: see README",
    },
    SettingDoc {
        name: "RUSTCCL_CUSTOM_GATHER_MAX_BYTES",
        kind: Kind::Tuning,
        default: "auto",
        doc: "largest all_gather_into_tensor output / reduce_scatter_tensor input (bytes) that goes through rustccl's NVLink kernels instead of NCCL (0: never); auto: see README",
    },
    SettingDoc {
        name: "RUSTCCL_NVRTC_LIBRARY",
        kind: Kind::Use,
        default: "",
        doc: "path of the libnvrtc used to compile the one-shot kernel; default: the one torch loaded, else libnvrtc.so.<major> on the library path",
    },
    SettingDoc {
        name: "RUSTCCL_TUNE",
        kind: Kind::Use,
        default: "cached",
        doc: "cached: a new group uses the table of shared-memory settings that python -m rustccl.tune measured for rank 0's host and the group's ranks per host, if there is one (every rank applies rank 0's; settings given by hand win), else the rules; run: as cached, and where there is no table and the group's ranks share one host, they measure one first (about a minute); off: the rules",
    },
    SettingDoc {
        name: "RUSTCCL_TUNE_DIR",
        kind: Kind::Use,
        default: "",
        doc: "directory of the tuned tables (RUSTCCL_TUNE); default ~/.cache/rustccl/tune",
    },
    SettingDoc {
        name: "RUSTCCL_FLIGHT_RECORDER_DIR",
        kind: Kind::Use,
        default: "",
        doc: "directory the flight recorder is written to when a collective times out (rustccl-flight-<group>-rank<r>-<pid>.json)",
    },
    SettingDoc {
        name: "RUSTCCL_FLIGHT_RECORDER_SIZE",
        kind: Kind::Use,
        default: "2000",
        doc: "operations each communicator's flight recorder keeps",
    },
    SettingDoc {
        name: "RUSTCCL_CHECK",
        kind: Kind::Use,
        default: "0",
        doc: "1: before every collective, ranks compare (op, dtype, sizes, root) over the CPU links and fail with both sides' calls on a mismatch (slow; for debugging)",
    },
    SettingDoc {
        name: "RUSTCCL_TLS",
        kind: Kind::Use,
        default: "0",
        doc: "1: TLS 1.3 on every TCP link between ranks (between hosts, and within one with RUSTCCL_TRANSPORT=tcp), authenticated by RUSTCCL_TLS_SECRET_FILE or by RUSTCCL_TLS_CA / _CERT / _KEY; every rank must set it alike",
    },
    SettingDoc {
        name: "RUSTCCL_TLS_CA",
        kind: Kind::Use,
        default: "",
        doc: "PEM file of the CA that signed every rank's certificate (with RUSTCCL_TLS=1; both directions verified, no host-name check)",
    },
    SettingDoc {
        name: "RUSTCCL_TLS_CERT",
        kind: Kind::Use,
        default: "",
        doc: "PEM file of this rank's certificate chain (with RUSTCCL_TLS=1 and RUSTCCL_TLS_CA)",
    },
    SettingDoc {
        name: "RUSTCCL_TLS_KEY",
        kind: Kind::Use,
        default: "",
        doc: "PEM file of this rank's private key (with RUSTCCL_TLS=1 and RUSTCCL_TLS_CERT)",
    },
    SettingDoc {
        name: "RUSTCCL_TLS_SECRET_FILE",
        kind: Kind::Use,
        default: "",
        doc: "file holding a secret (16 bytes or more) that every rank gets from its launcher; with RUSTCCL_TLS=1 and no certificates, the ranks derive the group's key from it",
    },
    SettingDoc {
        name: "RUSTCCL_FAULT",
        kind: Kind::Debug,
        default: "",
        doc: "fault injection for tests: action:rank=R:seq=S[:ms=N][:group=G], action delay (needs ms), drop, kill or panic (the rank's collective panics in its algorithm: it fails naming the panic and closes its links, so its peers fail at once, as with kill); CPU transport only",
    },
    SettingDoc {
        name: "RUSTCCL_DEBUG",
        kind: Kind::Use,
        default: "OFF",
        doc: "OFF, WARN, INFO or TRACE: logs to stderr (communicator creation, algorithms, errors)",
    },
];

/// Names of the environment's `RUSTCCL_*` variables that are not settings
/// of the engine but of its tools (build, tests, benchmarks).
const TOOL_PREFIXES: &[&str] = &["RUSTCCL_TEST_", "RUSTCCL_BENCH_", "RUSTCCL_TORCH_", "RUSTCCL_NETNS_", "RUSTCCL_BUILD_"];

/// Whether `name` is a `RUSTCCL_*` variable that nothing reads: a setting
/// misspelled, or one that no longer exists.
pub fn is_unknown(name: &str) -> bool {
    name.starts_with("RUSTCCL_") && !SETTINGS.iter().any(|s| s.name == name) && !TOOL_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The setting whose name is nearest to `name` (by edit distance), if it is
/// near enough to be what was meant.
pub fn closest(name: &str) -> Option<&'static str> {
    let (d, best) = SETTINGS.iter().map(|s| (edit_distance(name, s.name), s.name)).min()?;
    (d <= 3.max(name.len() / 5)).then_some(best)
}

/// Levenshtein distance between two ASCII names.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + (ca != cb) as usize).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The warning for an unknown `RUSTCCL_*` variable.
pub fn unknown_warning(name: &str) -> String {
    let hint = closest(name).map_or(String::new(), |c| format!(" (did you mean {c}?)"));
    format!("rustccl: ignoring {name}: no such setting{hint}; rustccl.config() lists the settings")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspelled_settings_are_named_with_the_closest_one() {
        assert!(is_unknown("RUSTCCL_TRANSPRT"));
        assert!(!is_unknown("RUSTCCL_TRANSPORT"));
        assert!(!is_unknown("RUSTCCL_TEST_ANYTHING"));
        assert!(!is_unknown("PATH"));
        assert_eq!(closest("RUSTCCL_TRANSPRT"), Some("RUSTCCL_TRANSPORT"));
        assert_eq!(closest("RUSTCCL_SHM_RING_BYTE"), Some("RUSTCCL_SHM_RING_BYTES"));
        assert_eq!(closest("RUSTCCL_COMPLETELY_DIFFERENT_THING"), None);
        let w = unknown_warning("RUSTCCL_TRANSPRT");
        assert!(w.contains("did you mean RUSTCCL_TRANSPORT?"), "{w}");
    }
}
