//! What a service registers in [`App::new`](super::App::new)'s setup.

use eventfold_core::{Aggregate, ProcessManager, Projection};
use eventfold_log::Log;
use eventfold_runtime::{RebuildStats, RuntimeBuilder, ViewOptions};
use indicatif::ProgressDrawTarget;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

type RebuildFuture = Pin<Box<dyn Future<Output = anyhow::Result<RebuildStats>> + Send>>;

/// Rebuilds one view type (see [`crate::rebuild::run`]).
pub(crate) type Rebuilder = fn(Arc<dyn Log>, String, ViewOptions, ProgressDrawTarget) -> RebuildFuture;

fn rebuild_of<P: Projection>(
    log: Arc<dyn Log>,
    app: String,
    options: ViewOptions,
    draw: ProgressDrawTarget,
) -> RebuildFuture {
    Box::pin(async move { crate::rebuild::run::<P>(log, &app, &options, draw).await })
}

/// The aggregates, views and process managers of a service, registered in its setup.
pub struct Services {
    builder: Option<RuntimeBuilder>,
    views: Vec<(&'static str, Rebuilder)>,
    process_managers: bool,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("views", &self.view_names())
            .finish_non_exhaustive()
    }
}

impl Services {
    pub(crate) fn new(builder: RuntimeBuilder, process_managers: bool) -> Self {
        Self {
            builder: Some(builder),
            views: Vec::new(),
            process_managers,
        }
    }

    fn map(&mut self, f: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder) -> &mut Self {
        let builder = self.builder.take().expect("the builder is put back after each change");
        self.builder = Some(f(builder));
        self
    }

    /// Runs aggregate type `A` with its configuration.
    pub fn aggregate<A: Aggregate>(&mut self, config: A::Config) -> &mut Self {
        self.map(|b| b.aggregate::<A>(config))
    }

    /// Keeps view `P` (served under `/v1/views/{name}`, rebuilt by `views rebuild {name}`).
    pub fn view<P: Projection>(&mut self) -> &mut Self {
        self.views.push((P::VIEW, rebuild_of::<P>));
        self.map(|b| b.view::<P>())
    }

    /// Runs process manager `P` with its configuration, unless the service was started
    /// with `--no-process-managers`.
    pub fn process_manager<P: ProcessManager>(&mut self, config: P::Config) -> &mut Self {
        if !self.process_managers {
            return self;
        }
        self.map(|b| b.process_manager::<P>(config))
    }

    /// Changes the runtime builder itself (process manager options, a clock, ...).
    pub fn runtime(&mut self, f: impl FnOnce(RuntimeBuilder) -> RuntimeBuilder) -> &mut Self {
        self.map(f)
    }

    /// The names of the registered views, in registration order.
    pub fn view_names(&self) -> Vec<&'static str> {
        self.views.iter().map(|(n, _)| *n).collect()
    }

    pub(crate) fn rebuilder(&self, name: &str) -> Option<Rebuilder> {
        self.views.iter().find(|(n, _)| *n == name).map(|(_, r)| *r)
    }

    pub(crate) fn into_builder(mut self) -> RuntimeBuilder {
        self.builder.take().expect("the builder is there")
    }
}
