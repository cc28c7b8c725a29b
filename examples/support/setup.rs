//! A run's set-up, shared by a training run and a launcher's check of the ranks it would start:
//! the flags, the data, the backend, the image and the batch.

use super::backend::open_backend;
use super::checks::{batch_size, check_flags, check_img, fixed_batch, host_holds};
use super::data::{batch_loader, input_channels, load};
use super::resume::check_position;
use super::{Common, Error, Example, Model, ModelFn};
use stax::alloc::human_bytes;
use stax::layers::{Mixed, Policy};
use stax::train::data::Dataset;
use stax::train::plan::MemoryPlan;
use stax::{Device, Shape};
use std::sync::Arc;

/// What a run is set up with: the data, the backend, the image `(height, width, channels)`,
/// the model's dtype policy, the model built for that image and the batch.
pub struct SetUp {
    pub train: Dataset,
    pub test: Dataset,
    pub backend: Arc<dyn stax::Backend>,
    pub image: (usize, usize, usize),
    pub policy: Policy,
    pub model: Model,
    pub batch: usize,
}

/// The flags checked, the data loaded, the backend opened, the image (`--img`, else 28 on the
/// CPU and `example.gpu_img` on a GPU) checked against the model, and the batch (`--batch`, or
/// for `auto` the largest that fits, at most this rank's share of the training set among
/// `world` ranks).
pub fn set_up(
    args: &Common,
    (example, model): (Example, ModelFn<'_>),
    world: usize,
) -> Result<SetUp, Error> {
    // what needs no backend first: opening one may compile the kernels
    check_flags(args)?;
    let (train, test) = load(args)?;
    let channels = input_channels(&train, &test)?;
    let classes = train.num_classes();
    if let Some(img) = args.img {
        check_img(model, (classes, channels), img)?;
    }
    let backend = open_backend(args)?;
    let cpu = backend.device() == Device::Cpu;
    let img = args.img.unwrap_or(if cpu { 28 } else { example.gpu_img });
    if args.img.is_none() {
        check_img(model, (classes, channels), img)?;
    }
    let image = (img, img, channels);
    let policy = args.precision()?.1;
    let m = Mixed::new(model(classes, image)?, policy);
    let batch = batch_size(args, &m, image, &backend, (train.len(), world))?;
    Ok(SetUp {
        train,
        test,
        backend,
        image,
        policy,
        model: m,
        batch,
    })
}

/// What a launcher checks once before it starts `world` ranks, from rank 0's flags (`args`,
/// its `device` the ranks'): when they train (not `--eval-only`), the global batch (`--batch`
/// on each rank) against the training set, and for CPU ranks a `--resume` position their
/// global batch can continue; for CPU ranks, which share this host, their planned peaks (each
/// with its gradient bucket) together against its available memory. GPU ranks are not set up
/// here (that would take device 0's memory): each checks its own plan against its device.
pub fn check_world(
    args: &Common,
    (example, model): (Example, ModelFn<'_>),
    world: usize,
) -> Result<(), Error> {
    let trains = !args.eval_only;
    if args.device != "cpu" {
        let Some(batch) = fixed_batch(args)?.filter(|_| trains) else {
            return Ok(());
        };
        let (train, _) = load(args)?;
        return batch_loader(train.len(), (batch, world), args.seed).map(drop);
    }
    let s = set_up(args, (example, model), world)?;
    let (img, channels) = (s.image.0, s.image.2);
    if trains {
        let loader = |seed| batch_loader(s.train.len(), (s.batch, world), seed);
        loader(args.seed)?;
        check_position(args, (&s.model, s.batch), loader)?;
    }
    let input = Shape::new([s.batch, img, img, channels]);
    let plan = MemoryPlan::with_feed(&s.model, &input, &args.adam(), &s.backend, args.feed())?;
    check_rank_budget(args, &plan, &s.backend)?;
    host_holds(&plan, &input, (world, args.dist.bucket))
}

/// With `--budget`, a rank's plan against it: a step that cannot fit even without the rank's
/// gradient bucket (the least budget its plan needs under the allocator, `min_budget`) is
/// refused before any rank starts.
fn check_rank_budget(
    args: &Common,
    plan: &MemoryPlan,
    backend: &Arc<dyn stax::Backend>,
) -> Result<(), Error> {
    let Some(budget) = args.budget()? else {
        return Ok(());
    };
    let need = plan.min_budget()?;
    if need <= budget {
        return Ok(());
    }
    Err(format!(
        "--budget {}: a rank's step needs at least {} under the {} allocator, before its \
         gradient bucket (raise --budget, or lower --batch or --img; --plan without --ranks \
         shows every buffer)",
        human_bytes(budget),
        human_bytes(need),
        backend.allocator().strategy()
    )
    .into())
}
