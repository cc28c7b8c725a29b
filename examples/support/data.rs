//! The examples' data: the training and test sets with `--data`, `--test-data`,
//! `--pixel-scale` and `--classes`, the model's input channels, and the smallest `--img` a
//! model takes.

use super::{Common, Error, ModelFn};
use stax::Shape;
use stax::layers::Layer;
use stax::train::TrainError;
use stax::train::data::npy::MAX_CLASSES;
use stax::train::data::{Dataset, Loader, PixelScaling, fashion_mnist_2class};

/// `--pixel-scale`, parsed (None: each data set's default).
fn pixel_scale(args: &Common) -> Result<Option<PixelScaling>, Error> {
    match args.pixel_scale.as_deref() {
        None => Ok(None),
        Some("unit") => Ok(Some(PixelScaling::Divide255)),
        Some("raw") => Ok(Some(PixelScaling::AsStored)),
        Some(other) => Err(format!("--pixel-scale {other:?}: expected unit or raw").into()),
    }
}

/// The training and test sets, scaled, with `--classes` classes when given.
pub fn load(args: &Common) -> Result<(Dataset, Dataset), Error> {
    let (train, test) = load_sets(args)?;
    let (train, test) = match pixel_scale(args)? {
        Some(s) => (train.with_scaling(s), test.with_scaling(s)),
        None => (train, test),
    };
    Ok(match args.classes {
        Some(k) if k > MAX_CLASSES => {
            return Err(format!("--classes {k}: at most {MAX_CLASSES} classes").into());
        }
        Some(k) => {
            let need = train.num_classes().max(test.num_classes());
            if k < need {
                let top = need - 1;
                let e = format!("--classes {k}: the data has {need} classes (labels 0 to {top})");
                return Err(format!("{e}; give at least {need}").into());
            }
            (train.with_num_classes(k)?, test.with_num_classes(k)?)
        }
        None => (train, test),
    })
}

fn load_sets(args: &Common) -> Result<(Dataset, Dataset), Error> {
    match (&args.data, &args.test_data) {
        (None, None) => Ok(fashion_mnist_2class()?),
        (Some(train), Some(test)) => {
            let open = |flag: &str, path: &std::path::Path| {
                Dataset::from_npz(path, None, None)
                    .map_err(|e| format!("{flag} {}: {e}", path.display()))
            };
            let (train, test) = (open("--data", train)?, open("--test-data", test)?);
            // One model for both splits: as many classes as either split names.
            let k = train.num_classes().max(test.num_classes());
            Ok((train.with_num_classes(k)?, test.with_num_classes(k)?))
        }
        _ => Err("--data and --test-data go together".into()),
    }
}

/// The model's input channels: the data's (gray is replicated to 3, as the seed's RGB input),
/// checked for both splits before anything trains.
pub fn input_channels(train: &Dataset, test: &Dataset) -> Result<usize, Error> {
    let (ct, cv) = (train.image_shape().2, test.image_shape().2);
    let channels = ct.max(cv).max(3);
    for (split, c) in [("training", ct), ("test", cv)] {
        if c != 1 && c != channels {
            return Err(format!(
                "{split} images have {c} channels but the model takes {channels} \
                 (channel counts must match, or be 1 for gray)"
            )
            .into());
        }
    }
    Ok(channels)
}

/// The smallest square image (`--img`) whose shapes `model` takes with `channels` channels, up
/// to `at_most`; None when none does.
pub fn smallest_img(
    model: ModelFn<'_>,
    (classes, channels): (usize, usize),
    at_most: usize,
) -> Result<Option<usize>, Error> {
    Ok((1..=at_most).find(|&img| takes(model, (classes, channels), img).is_ok()))
}

/// Whether `model` builds for `img`x`img` images of `channels` channels and its shapes take
/// them (a batch of one); the build's or the shapes' error if not.
pub fn takes(
    model: ModelFn<'_>,
    (classes, channels): (usize, usize),
    img: usize,
) -> Result<(), Error> {
    let m = model(classes, (img, img, channels))?;
    let input = stax::Tree::leaf(Shape::new([1, img, img, channels]));
    m.output_shape(&input)?;
    Ok(())
}

/// The loader of `examples` in global batches of `batch` examples on each of `world` ranks; a
/// batch larger than the training set names `--batch` (and the ranks, where there are several).
pub fn batch_loader(
    examples: usize,
    (batch, world): (usize, usize),
    seed: u64,
) -> Result<Loader, Error> {
    Loader::new(examples, batch * world, seed).map_err(|e| match e {
        TrainError::BatchTooLarge { .. } if world == 1 => format!("--batch {batch}: {e}").into(),
        TrainError::BatchTooLarge { .. } => format!("--batch {batch} on {world} ranks: {e}").into(),
        e => Error::from(e),
    })
}
