//! The world: start-up, the communication object [`Comm`], and finalisation.

use crate::am::{internal, HandlerEntry, HandlerFn};
use crate::collective::CollectiveState;
use crate::config::{Config, Overrides, Progress, RmaPath};
use crate::ops::OpTable;
use crate::segment::SegmentTable;
use crate::startup::Startup;
use crate::{AmHandler, AmMsg, Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use weft_fabric::{Caps, Fabric, Resource};

static NEXT_WORLD_ID: AtomicU64 = AtomicU64::new(1);

/// Sets up a [`World`]: handlers, then options, then [`Builder::init`].
///
/// ```no_run
/// # use weft_runtime as weft;
/// let mut b = weft::World::builder();
/// let pong = b.handler("pong", |am| println!("pong from rank {}", am.src()));
/// let ping = b.handler("ping", move |am| am.reply_short(pong, am.args()).expect("reply"));
/// let world = b.progress(weft::Progress::Always).init()?;
/// world.am_request_short((world.rank() + 1) % world.size(), ping, &[7])?;
/// world.barrier()?;
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub struct Builder {
    handlers: Vec<HandlerEntry>,
    overrides: Overrides,
    pub(crate) ext: crate::layer::Extensions,
}

/// The layers above the runtime that every world includes. Each entry adds its AM handlers,
/// progress hook and start-up steps to every [`Builder`] as it is made, so one
/// [`World::init`] gives every feature of the layers a program links (the RPC layer,
/// `weft-rpc`, is one). Entries run in link order, the same on every rank of one program.
#[linkme::distributed_slice]
pub static LAYERS: [fn(&mut Builder)];

impl Default for Builder {
    fn default() -> Self {
        let mut b = Builder {
            handlers: Vec::new(),
            overrides: Overrides::default(),
            ext: crate::layer::Extensions::default(),
        };
        for layer in LAYERS {
            layer(&mut b);
        }
        b
    }
}

impl Builder {
    /// Registers an active-message handler under `name` and returns its id. Every rank must
    /// register the same names in the same order (checked at start-up). Handlers run during
    /// progress on the target, possibly on several threads at once, and must not block.
    pub fn handler(&mut self, name: &str, f: impl Fn(&AmMsg<'_>) + Send + Sync + 'static) -> AmHandler {
        let id = (internal::COUNT as usize + self.handlers.len()) as u16;
        self.handlers.push(HandlerEntry { name: name.to_string(), f: Arc::new(f) as HandlerFn });
        AmHandler(id)
    }
    /// Chooses the progress thread (overrides `WEFT_PROGRESS_THREAD`; see [`Progress`]).
    pub fn progress(&mut self, p: Progress) -> &mut Self {
        self.overrides.progress = Some(p);
        self
    }
    /// Size of each AM ring in KiB, whatever the ranks (overrides `WEFT_AM_RING_KIB` and the
    /// `WEFT_AM_INBOX_KIB` budget).
    pub fn am_ring_kib(&mut self, kib: usize) -> &mut Self {
        self.overrides.ring_kib = Some(kib);
        self
    }
    /// How long waits spin before backing off (overrides `WEFT_SPIN_US`).
    pub fn spin_us(&mut self, us: u64) -> &mut Self {
        self.overrides.spin_us = Some(us);
        self
    }
    /// Which path carries RMA and atomics (overrides `WEFT_RMA`).
    pub fn rma_path(&mut self, p: RmaPath) -> &mut Self {
        self.overrides.rma = Some(p);
        self
    }
    /// Start-up timeout in seconds (overrides `WEFT_INIT_TIMEOUT_S`).
    pub fn init_timeout_s(&mut self, s: u64) -> &mut Self {
        self.overrides.init_timeout_s = Some(s);
        self
    }
    /// Largest per-member message, in bytes, for which team collectives use their latency
    /// algorithms (overrides `WEFT_COLL_SMALL_BYTES`).
    pub fn coll_small_bytes(&mut self, bytes: usize) -> &mut Self {
        self.overrides.coll_small_bytes = Some(bytes);
        self
    }
    /// Joins the job: connects to every rank and checks that all registered the same handlers.
    pub fn init(&mut self) -> Result<World> {
        let startup = Startup::detect()?;
        let cfg = Config::resolve(&self.overrides, startup.identity()?.as_ref())?;
        let fabric = open_fabric(&cfg, &startup)?;
        let user = std::mem::take(&mut self.handlers);
        World::start(fabric, cfg, user, std::mem::take(&mut self.ext))
    }
}

/// Opens the fabric the configuration names.
fn open_fabric(cfg: &Config, startup: &Startup) -> Result<Box<dyn Fabric>> {
    Ok(weft_fabric::open(&weft_fabric::OpenConfig {
        choice: &cfg.fabric,
        job: &cfg.job,
        rank: cfg.rank,
        size: cfg.size,
        rings: cfg.rings,
        init_timeout: cfg.init_timeout,
        bootstrap: startup.bootstrap(),
    })?)
}

/// Everything a rank communicates through; reached from a [`World`] (which dereferences to it)
/// and from inside AM handlers ([`AmMsg::comm`]). `Comm` is `Send + Sync`: any thread may use
/// it at any time (MPI_THREAD_MULTIPLE semantics).
pub struct Comm {
    pub(crate) fabric: Box<dyn Fabric>,
    pub(crate) cfg: Config,
    pub(crate) caps: Caps,
    pub(crate) native_rma: bool,
    pub(crate) native_atomics: bool,
    pub(crate) handlers: Vec<HandlerEntry>,
    pub(crate) segments: SegmentTable,
    pub(crate) ops: OpTable,
    pub(crate) coll: CollectiveState,
    pub(crate) id: u64,
    pub(crate) has_error: AtomicBool,
    pub(crate) error: Mutex<Option<Error>>,
    pub(crate) stop: AtomicBool,
    /// Application threads inside a wait that delivers everything (the progress thread
    /// stands aside while there is one).
    pub(crate) waiting: std::sync::atomic::AtomicUsize,
    pub(crate) ext: crate::layer::Extensions,
    pub(crate) dists: crate::dist::DistTable,
    pub(crate) counts: crate::completion::Counts,
    /// Teams whose non-blocking collectives futures await (see `Comm::drive_teams`).
    pub(crate) awaited_teams: Mutex<Vec<std::sync::Weak<crate::team::Core>>>,
    pub(crate) any_awaited_team: AtomicBool,
    /// The progress thread, to wake ([`Progress::OnDemand`]).
    pub(crate) helper: std::sync::OnceLock<std::thread::Thread>,
    /// An application thread made progress (polled or waited) since the on-demand thread last
    /// looked. Sends alone do not count: a rank that only sends still needs serving.
    pub(crate) active: AtomicBool,
    /// A future went pending since the on-demand thread last looked.
    pub(crate) wanted: AtomicBool,
    /// Pending polls of futures with [`Progress::Off`], to check their peers now and then.
    pub(crate) off_polls: std::sync::atomic::AtomicU32,
    /// Endpoint operations that left their endpoint's slot for the world's path (see
    /// [`Stats::off_slot`]).
    pub(crate) off_slot: AtomicU64,
    /// This world's own handle, for the owned handles its calls return.
    me: std::sync::Weak<Comm>,
}

/// What a rank counted (see [`Comm::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// The fabric's counters.
    pub fabric: crate::FabricStats,
    /// Operations posted through an [`crate::Endpoint`] whose slot carries RMA to their
    /// target (libfabric) that went on the world's shared path instead (puts, gets,
    /// atomics; AMs and RPC calls always leave through the slot). Shared memory's slots
    /// carry AMs only: its puts are CPU copies on the world's path by design, not counted.
    pub off_slot: u64,
}

/// This rank's membership of the job. Dereferences to [`Comm`], where the operations are.
/// Dropping it finalises: pending implicit operations are completed, the progress thread is
/// stopped, and peers that wait on this rank from then on get an error instead of hanging.
pub struct World {
    comm: Arc<Comm>,
    progress: Option<JoinHandle<()>>,
}

impl World {
    /// A [`Builder`] to register handlers and set options before joining.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Joins the job with the default settings and no user handlers.
    pub fn init() -> Result<World> {
        Builder::default().init()
    }

    fn start(
        fabric: Box<dyn Fabric>,
        mut cfg: Config,
        user: Vec<HandlerEntry>,
        mut ext: crate::layer::Extensions,
    ) -> Result<World> {
        crate::am::watch_fork();
        let caps = fabric.caps();
        if !cfg.progress_chosen && caps.target_progress {
            cfg.progress = Progress::Always;
        }
        let mut handlers = internal::handlers();
        handlers.extend(user);
        if handlers.len() > u16::MAX as usize {
            return Err(Error::TooLarge {
                what: "number of AM handlers",
                len: handlers.len(),
                max: u16::MAX as usize,
            });
        }
        let am_rma = cfg.rma == RmaPath::ActiveMessages;
        let steps = std::mem::take(&mut ext.on_start);
        let counts = crate::completion::Counts::new(cfg.size);
        let comm = Arc::new_cyclic(|me| Comm {
            me: me.clone(),
            caps,
            native_rma: caps.rma && !am_rma,
            native_atomics: caps.atomics && !am_rma,
            coll: CollectiveState::new(),
            fabric,
            handlers,
            segments: SegmentTable::new(),
            ops: OpTable::default(),
            id: NEXT_WORLD_ID.fetch_add(1, Ordering::Relaxed),
            has_error: AtomicBool::new(false),
            error: Mutex::new(None),
            stop: AtomicBool::new(false),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            ext,
            cfg,
            dists: Default::default(),
            counts,
            awaited_teams: Mutex::new(Vec::new()),
            any_awaited_team: AtomicBool::new(false),
            helper: Default::default(),
            active: AtomicBool::new(false),
            wanted: AtomicBool::new(false),
            off_polls: std::sync::atomic::AtomicU32::new(0),
            off_slot: AtomicU64::new(0),
        });
        crate::dist::register_world(comm.id, Arc::downgrade(&comm));
        // Another process claiming this rank is heard on a fabric thread: the rank's next
        // wait fails (woken if asleep). A weak handle: the fabric is the world's.
        let weak = Arc::downgrade(&comm);
        comm.fabric.set_alarm(Box::new(move |e| {
            if let Some(c) = weak.upgrade() {
                c.record_error(e.into());
                c.fabric.notify(c.rank());
            }
        }));
        comm.check_handler_tables()?;
        for step in steps {
            step(&comm)?;
        }
        let progress = match comm.cfg.progress {
            Progress::Off => None,
            mode => {
                let c = comm.clone();
                let builder = std::thread::Builder::new().name(format!("weft-progress-{}", comm.rank()));
                let t = weft_fabric::signals::spawn_quiet(builder, move || match mode {
                    Progress::OnDemand => c.on_demand_loop(),
                    _ => c.progress_loop(),
                })
                .map_err(|e| Error::Config(format!("cannot start the progress thread: {e}")))?;
                let _ = comm.helper.set(t.thread().clone());
                Some(t)
            }
        };
        Ok(World { comm, progress })
    }
}

impl std::ops::Deref for World {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.comm
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.comm.sync_nbi();
        self.comm.stop.store(true, Ordering::Release);
        // Futures still awaited anywhere end now (their polls would find nothing to drive).
        self.comm.fail_all_awaited(crate::am::FINALIZED);
        self.comm.fabric.notify(self.comm.rank());
        if let Some(t) = self.progress.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        self.comm.fabric.finalize();
        // What the fabric holds outside this process goes now, even where handles (or
        // OpenSHMEM's state) keep the fabric itself.
        self.comm.fabric.release();
    }
}

/// What `weft info` shows about a world.
#[derive(Clone, Debug)]
pub struct Info {
    /// Fabric name.
    pub fabric: &'static str,
    /// This rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// Native capabilities.
    pub caps: Caps,
    /// Whether RMA/atomics use the AM-based path.
    pub rma_over_am: bool,
    /// Segments: (id, bytes on each rank).
    pub segments: Vec<(u32, usize)>,
    /// Registered AM handlers (internal ones first).
    pub handlers: Vec<String>,
    /// Communication resources held by the fabric.
    pub resources: Vec<Resource>,
    /// Bytes of shared memory this rank created that are in memory now (its inbox and
    /// regions: what it holds in `/dev/shm`); `None` on fabrics without.
    pub shm_in_memory: Option<u64>,
    /// The progress thread.
    pub progress: Progress,
    /// Operations in flight that wait for a completion event.
    pub ops_in_flight: usize,
}

impl Comm {
    /// An owned handle to this world, for threads and tasks that outlive a borrow (the
    /// handles and futures weft returns hold one already).
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let comm = world.arc();
    /// std::thread::spawn(move || comm.barrier()).join().unwrap()?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn arc(&self) -> Arc<Comm> {
        // Every Comm lives in the Arc that World::start made, and a borrow of it keeps that
        // Arc alive.
        self.me.upgrade().expect("a borrowed world is alive")
    }

    /// This rank, `0..size()`.
    pub fn rank(&self) -> u32 {
        self.cfg.rank
    }
    /// Number of ranks in the job.
    pub fn size(&self) -> u32 {
        self.cfg.size
    }
    /// The resolved configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }
    /// The fabric's native capabilities.
    pub fn caps(&self) -> Caps {
        self.caps
    }
    /// What this rank counted: the fabric's bounce-buffer bytes and registrations of memory
    /// the caller owns (zero-copy RPC chunks and, under `FI_MR_LOCAL`, transfer buffers on
    /// networks), and endpoint operations that left their endpoint's slot.
    ///
    /// ```no_run
    /// # use weft_runtime as weft;
    /// let world = weft::World::init()?;
    /// let s = world.stats();
    /// assert!(s.fabric.released <= s.fabric.registrations);
    /// # Ok::<(), weft::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        Stats { fabric: self.fabric.stats(), off_slot: self.off_slot.load(Ordering::Relaxed) }
    }
    /// Fabric, segments, handlers and resources of this rank.
    pub fn info(&self) -> Info {
        Info {
            fabric: self.fabric.name(),
            rank: self.rank(),
            size: self.size(),
            caps: self.caps,
            rma_over_am: !self.native_rma,
            segments: self.segments.list(),
            handlers: self.handlers.iter().map(|h| h.name.clone()).collect(),
            resources: self.fabric.resources(),
            shm_in_memory: self.fabric.shm_in_memory(),
            progress: self.cfg.progress,
            ops_in_flight: self.ops.in_flight(),
        }
    }

    /// Records an error found during progress; the next `poll` or wait returns it.
    pub(crate) fn record_error(&self, e: Error) {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(e);
        }
        self.has_error.store(true, Ordering::Release);
    }

    #[inline]
    pub(crate) fn take_error(&self) -> Result<()> {
        if self.has_error.load(Ordering::Acquire) {
            return self.take_recorded_error();
        }
        Ok(())
    }

    #[cold]
    fn take_recorded_error(&self) -> Result<()> {
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        self.has_error.store(false, Ordering::Release);
        slot.take().map_or(Ok(()), Err)
    }

    fn check_handler_tables(&self) -> Result<()> {
        let names: Vec<&str> = self.handlers.iter().map(|h| h.name.as_str()).collect();
        let mine = names.join("\n");
        let all = self.exchange(mine.as_bytes())?;
        for (r, theirs) in all.iter().enumerate() {
            if theirs != mine.as_bytes() {
                let theirs = String::from_utf8_lossy(theirs);
                let t: Vec<&str> = theirs.split('\n').collect();
                let i = names.iter().zip(&t).position(|(a, b)| a != b).unwrap_or(names.len().min(t.len()));
                return Err(Error::Mismatch(format!(
                    "AM handler tables differ: rank {} has {} handlers, rank {r} has {}; first difference at #{i}: {:?} vs {:?}",
                    self.rank(),
                    names.len(),
                    t.len(),
                    names.get(i).copied().unwrap_or("<none>"),
                    t.get(i).copied().unwrap_or("<none>")
                )));
            }
        }
        Ok(())
    }
}
