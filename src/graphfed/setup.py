"""A run's setup, built once from a validated config; the simulator and every Flower node import it.

:func:`resolve_method` is the one place where ``method.name`` becomes a class and ``method.options`` its typed
options, and where the config's ``train`` section becomes the clients' one :class:`LocalTraining`. Everything
downstream receives the :class:`MethodSetup` (or the :class:`ClientSide` / :class:`Setup` built from it), never the
name or the raw options again.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import torch

from graphfed.attacks import Attack, build_attack
from graphfed.attacks.defenses import SimpleTuning
from graphfed.client.autotune import choose_clients_per_chunk, choose_conv_kernel, require_conv_kernel
from graphfed.client.contract import ClientRule, ClientSetting, LocalTraining
from graphfed.client.executor import ArchitectureRuntime, ClientExecutor, ClientRuntime, ClientStateStore
from graphfed.client.placement import HostRandomDraws, resolve_device, use_tensor_cores
from graphfed.client.privacy import PrivacyPlan, plan_privacy
from graphfed.client.side_by_side import side_by_side_workers
from graphfed.client.thread_choice import CHOICE_STEPS, SCORED_ROWS, RoundShape, ThreadsChoice, choose_torch_threads
from graphfed.config import RunConfig
from graphfed.core import rng
from graphfed.core.memory import check_fits, fits
from graphfed.core.params import ParamSpec
from graphfed.data import DATASETS, build_federation
from graphfed.data.federation import Federation
from graphfed.methods import METHODS, method_class, parse_options
from graphfed.methods.base import Method, MethodContext, MethodOptions
from graphfed.models import MODELS, build_model
from graphfed.models.base import TargetModel
from graphfed.models.family import ArchitectureFamily, build_family
from graphfed.provenance import PACKAGE_ROOT


@dataclass(frozen=True)
class MethodSetup:
    """``config.method`` and ``config.train`` resolved: the method's class, its typed options and how its clients
    train (steps, batch, lr, and what feedback they report)."""

    cls: type[Method]
    options: MethodOptions
    training: LocalTraining

    @property
    def name(self) -> str:
        return self.cls.name

    def client_rule(self, setting: ClientSetting) -> ClientRule:
        """The method's client side for a network described by ``setting``."""
        return self.cls.client_rule(self.options, setting)


def privacy_plan(config: RunConfig, federation: Federation, method: MethodSetup) -> PrivacyPlan:
    """``privacy:`` of ``config`` resolved for ``federation``: its noise sized for the most releases any client
    makes (a novel client that adapts makes ``train.novel_adapt_rounds`` uploads)."""
    train = config.train
    adapts = bool(len(federation.novel_client_ids)) and method.cls.adapts_novel_clients
    return plan_privacy(config.privacy, len(federation.train_client_ids), train.clients_per_round, train.rounds,
                        train.novel_adapt_rounds if adapts else 0)


#: what a comparison says of a row whose method releases nothing under a private config
RELEASES_NOTHING = ("{method} releases nothing (each client trains alone; no update leaves it): it ran without a "
                    "privacy mechanism, epsilon 0")


def without_needless_privacy(data: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A config's data whose method releases nothing (Local) under a privacy mechanism: the mechanism removed (a
    run of it would refuse one) and the note that says so; any other config unchanged, with None."""
    privacy, method = data.get("privacy") or {}, (data.get("method") or {}).get("name")
    if privacy.get("mechanism", "none") == "none" or method not in METHODS or METHODS[method].communicates:
        return data, None  # (an unknown method is refused where the config is validated)
    return {**data, "privacy": {"mechanism": "none"}}, RELEASES_NOTHING.format(method=method)


def resolve_method(config: RunConfig) -> MethodSetup:
    """The method of ``config``: ConfigError (one line, naming the field) for an unknown name or a bad option."""
    cls = method_class(config.method.name)
    options = parse_options(cls, config.method.options)
    feedback, feedback_mu = cls.client_feedback(options)
    training = LocalTraining(config.train.local_steps, config.train.batch_size, config.train.lr, feedback,
                             feedback_mu, config.train.precision)
    return MethodSetup(cls, options, training)


def client_setting(model: TargetModel, spec: ParamSpec, federation: Federation, training: LocalTraining,
                   architecture: TargetModel | None = None) -> ClientSetting:
    """What a client rule may know about the model, the task and the training (same in every engine)."""
    norm = tuple(f"{module_name}.{name}" if module_name else name
                 for module_name, module in model.named_modules()
                 if isinstance(module, torch.nn.modules.batchnorm._NormBase)
                 for name, _ in module.named_parameters(recurse=False))
    return ClientSetting(spec, model.head_names, federation.task, federation.output_dim, training,
                         None if architecture is model else architecture, norm)


def clients_rows_on_host(config: RunConfig, federation: Federation, device: torch.device) -> bool:
    """``train.client_data``: keep the clients' rows in host memory (copied to ``device`` as they are read) or move
    them onto it. ``auto`` keeps them on the host only when they would not fit in the device's free memory;
    ``device`` refuses such a federation before round 1 (one line, with what to change)."""
    if config.train.client_data == "host":
        return True
    if device.type == "cpu":
        return False
    splits = [federation.train, *(getattr(federation, name) for name in federation.evaluation_splits)]
    needed = sum(split.x.nbytes + split.y.nbytes for split in splits)
    if config.train.client_data == "auto":
        return not fits(needed, device)
    check_fits(needed, f"the federation's rows on {device}", "set train.client_data=host (rows stay in host memory "
               "and stream to the device), use fewer clients (dataset.client_fraction) or train.device=cpu", device)
    return False


@dataclass
class ClientSide:
    """The networks clients train and their method's client rules, built from a config the same way by the
    simulator and by every Flower node (once per run).

    One architecture: ``model`` and its ``spec``. Mixed architectures (``model.architectures``): the ``family``,
    the network each architecture's clients train (``networks``), and ``spec``/``init_weights`` of the wire (what
    the method's ``client_networks`` says travels); ``model`` is then the first architecture's network. ``rules``:
    the method's client rule for each network (one without mixed architectures).

    ``attack`` says which clients are malicious (``attack:`` in the config); ``federation`` is the data as the clients
    hold it, malicious clients' training rows already rewritten by a data attack.
    """

    config: RunConfig
    method: MethodSetup
    federation: Federation
    model: TargetModel
    spec: ParamSpec
    init_weights: torch.Tensor
    attack: Attack
    rules: list[ClientRule]
    device: torch.device
    family: ArchitectureFamily | None = None
    networks: list[TargetModel] = field(default_factory=list)

    @classmethod
    def build(cls, config: RunConfig, federation: Federation, method: MethodSetup,
              device: torch.device | None = None) -> ClientSide:
        """Networks are initialised on the host from the run's seed (the same weights on every device), then they
        and the clients' data move to ``device`` (default: ``train.device``)."""
        device = resolve_device(config.train.device) if device is None else device
        use_tensor_cores(config.train.precision)
        attack = build_attack(config.attack, federation, config.seed)
        federation = attack.poison(federation)
        federation = federation.to(device, rows_on_host=clients_rows_on_host(config, federation, device))
        torch.manual_seed(rng.stream_seed(config.seed, 0, "init"))
        if config.model.architectures is None:
            model = build_model(config.model.name, federation, config.model.options)
            if config.model.base is not None:  # the pretrained base, before anything reads the weights
                from graphfed.models.pretrained import load_base

                model.base_record = load_base(model, config.model.base, config.model.name, config.model.options)
            model = model.to(device)
            check_conv_kernel(config, [model])
            spec = ParamSpec.from_module(model)
            rule = method.client_rule(client_setting(model, spec, federation, method.training))
            return cls(config, method, federation, model, spec, spec.flatten_module(model), attack, [rule], device)
        family = build_family(config.model.name, config.model.options, config.model.architectures,
                              config.model.architecture_of, federation, config.seed).to(device)
        torch.manual_seed(rng.stream_seed(config.seed, 0, "init"))
        spec, init_weights, networks = method.cls.client_networks(method.options, family)
        networks = [network.to(device) for network in networks]
        check_conv_kernel(config, networks)
        rules = [method.client_rule(client_setting(network, ParamSpec.from_module(network), federation,
                                                   method.training, family.models[arch]))
                 for arch, network in enumerate(networks)]
        return cls(config, method, federation, networks[0], spec, init_weights.to(device), attack, rules, device,
                   family, networks)

    @property
    def rule(self) -> ClientRule:
        """The client rule (with mixed architectures: the first architecture's)."""
        return self.rules[0]

    @functools.cached_property
    def privacy(self) -> PrivacyPlan:
        """``privacy:`` resolved for this federation: the server and every node compute the same plan."""
        return privacy_plan(self.config, self.federation, self.method)

    def executor(self, seed: int, client_ids: torch.Tensor | None = None) -> ClientRuntime | ArchitectureRuntime:
        """Clients in this process (``client_ids``: the ones kept here, default all), grouped by architecture where
        they differ."""
        if self.family is None:
            store = None if client_ids is None else ClientStateStore(client_ids, self.device)
            return ClientRuntime(self.model, self.spec, self.federation, self.rules[0], seed, store, self.attack,
                                 self.simple_tuning(), self.privacy)
        return ArchitectureRuntime(self.family, self.networks, self.rules, self.federation, seed, self.spec.dim,
                                   client_ids, self.attack, self.privacy)

    def plan_execution(self, clients_at_once: int) -> dict[str, Any]:
        """Sets how each network runs its clients' convolutions (``train.conv_kernel``) and how many clients it
        trains at once (``train.clients_per_chunk``), each measured when ``train.autotune`` where it is to be chosen
        (:mod:`graphfed.client.autotune`), and returns the record the summary keeps."""
        train = self.config.train
        networks = self.networks or [self.model]
        names = self.family.names if self.family is not None else [self.config.model.name]
        choices: dict[str, Any] = {}
        for name, network, rule in zip(names, networks, self.rules, strict=True):
            kernel = choose_conv_kernel(network, rule.spec, self.federation.train, rule, clients_at_once,
                                        train.autotune, train.conv_kernel)
            network.conv_kernel = kernel.conv_kernel
            choice = choose_clients_per_chunk(network, rule.spec, self.federation.train, rule,
                                              clients_at_once, train.autotune, train.clients_per_chunk)
            network.clients_per_chunk = choice.clients_per_chunk
            choices[name] = choice.record()
            if kernel.conv_kernel is not None:
                choices[name]["conv_kernel"] = kernel.record()
            if choice.clients_per_chunk == 1 and network.loops_clients_on(self.device):
                # one-client chunks of plain SGD train this many at a time (graphfed.client.training)
                choices[name]["clients_side_by_side"] = side_by_side_workers(self.device)
        return choices

    def simple_tuning(self) -> SimpleTuning | None:
        """The Simple-Tuning defence of ``defense:``, if on (one architecture only: the config checks it)."""
        defense, train = self.config.defense, self.config.train
        if not defense.simple_tuning:
            return None
        return SimpleTuning(defense.tuning_steps or train.local_steps, defense.tuning_lr or train.lr,
                            self.init_weights)

    def wire_values(self, client_ids: torch.Tensor) -> int:
        """Values sent to (or from) ``client_ids``: on the ``own`` wire, each client's architecture's size."""
        if self.family is not None and self.method.cls.architectures == "own":
            return sum(self.family.specs[int(arch)].dim for arch in self.family.assignment[client_ids])
        return len(client_ids) * self.spec.dim


@dataclass
class Setup:
    """Everything built from a config before the first round: the data, the clients' side and the server's
    method instance."""

    config: RunConfig
    clients: ClientSide
    method: Method

    @property
    def federation(self) -> Federation:
        return self.clients.federation

    @property
    def model(self) -> TargetModel:
        """The network clients train (with mixed architectures: the first architecture's)."""
        return self.clients.model

    @property
    def spec(self) -> ParamSpec:
        """What travels on the wire."""
        return self.clients.spec

    @property
    def client_rule(self) -> ClientRule:
        return self.clients.rule

    @property
    def training(self) -> LocalTraining:
        return self.clients.method.training

    @property
    def family(self) -> ArchitectureFamily | None:
        return self.clients.family

    def wire_values(self, client_ids: torch.Tensor) -> int:
        return self.clients.wire_values(client_ids)

    def client_executor(self, seed: int) -> ClientExecutor:
        return self.clients.executor(seed)


#: the module of each attack (update forgeries share one)
ATTACK_MODULES = {"label_flip": "attacks/label_flip.py", "backdoor": "attacks/backdoor.py"}


def _source_of(obj: Any) -> str | None:
    """The package path of the module defining ``obj`` (None outside graphfed: a plugin is not tracked)."""
    module = getattr(obj, "__module__", "") or ""
    if not module.startswith("graphfed."):
        return None
    relative = module.removeprefix("graphfed.").replace(".", "/")
    return relative + ("/__init__.py" if (PACKAGE_ROOT / relative).is_dir() else ".py")


def run_roots(config: RunConfig) -> list[str]:
    """The run-specific sources a run of ``config`` starts from (:func:`graphfed.provenance.run_code` follows their
    imports): its method's class and those it derives from, the classes its model's builder constructs, its dataset's
    builder and its attack."""
    roots = [_source_of(cls) for cls in resolve_method(config).cls.__mro__]
    builder = MODELS.get(config.model.name, (None, ""))[0]
    if builder is not None:
        roots += [_source_of(value) for value in inspect.getclosurevars(builder).globals.values()
                  if inspect.isclass(value)] + [_source_of(builder)]
    dataset = DATASETS.get(config.dataset.name)
    if dataset is not None:
        roots.append(_source_of(dataset.build))
    if config.attack.kind != "none":
        roots.append(ATTACK_MODULES.get(config.attack.kind, "attacks/poisoning.py"))
    if config.defense.simple_tuning:
        roots.append("attacks/defenses.py")
    return [root for root in dict.fromkeys(roots) if root is not None]


def check_before_data(config: RunConfig, method: MethodSetup) -> None:
    """The model and the method's client side, built on the dataset's shape where its config alone decides it, so a
    combination that cannot run (FedBN on a model without BatchNorm, a CNN on rows too small) is refused before
    slow files are read. The draws it makes leave torch's random state as it was."""
    info = DATASETS.get(config.dataset.name)
    if info is None or info.shape is None or config.model.architectures is not None:
        return
    input_shape, output_dim = info.shape(config.dataset)
    stub = SimpleNamespace(name=config.dataset.name, task=info.task, input_shape=input_shape, output_dim=output_dim)
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model.name, stub, config.model.options)  # type: ignore[arg-type]
        check_conv_kernel(config, [model])
        method.client_rule(client_setting(model, ParamSpec.from_module(model), stub, method.training))  # type: ignore[arg-type]


def check_conv_kernel(config: RunConfig, networks: list[TargetModel]) -> None:
    """A pinned ``train.conv_kernel`` is one every network can run (ConfigError naming the ones it can)."""
    if config.train.conv_kernel != "auto":
        for network in networks:
            require_conv_kernel(network, config.train.conv_kernel)


def resolve_torch_threads(config: RunConfig, measure: bool = True) -> tuple[RunConfig, dict[str, Any] | None]:
    """``config`` with ``torch_threads`` set, and the record of how it was chosen. A count the config gives is kept;
    unset, it is this process's count, except for a classification network that trains its clients one by one on
    a CPU (BatchNorm), where one thread each with clients side by side is measured against it on a round of the
    config's shape and cached (:mod:`graphfed.client.thread_choice`; ``train.autotune: false`` keeps the count).
    Decided before the data are read, on rows of the dataset's shape, so everything the run computes uses the
    recorded count. ``measure=False`` (clients that run in other processes) keeps this process's count."""
    if config.torch_threads is not None:
        return config, None
    _restore_own_threads()
    choice = (_measured_threads(config) if measure and torch.get_num_threads() > 1 and config.train.autotune
              else None)
    threads = torch.get_num_threads() if choice is None else choice.torch_threads
    return config.model_copy(update={"torch_threads": threads}), None if choice is None else choice.record()


#: the thread count a run last set (``torch_threads``), and the process's own count before runs set it
_RUN_THREADS: dict[str, int] = {}


def set_run_threads(threads: int) -> None:
    """torch's intra-op threads for a run, remembering the process's own count the first time a run changes it."""
    current = torch.get_num_threads()
    if _RUN_THREADS.get("set") != current:  # not a count a run set: the process's (or its user's) own
        _RUN_THREADS["own"] = current
    torch.set_num_threads(threads)
    _RUN_THREADS["set"] = threads


def _restore_own_threads() -> None:
    """Back to the process's own count if an earlier run changed it (a run that chose 1 thread for its BatchNorm
    clients leaves the next run, of another network, to choose from the process's count again)."""
    if "own" in _RUN_THREADS and torch.get_num_threads() == _RUN_THREADS["set"]:
        torch.set_num_threads(_RUN_THREADS["own"])
        _RUN_THREADS["set"] = _RUN_THREADS["own"]


def _measured_threads(config: RunConfig) -> ThreadsChoice | None:
    """The thread count measured (or cached) for ``config``'s network, None where there is nothing to choose."""
    info = DATASETS.get(config.dataset.name)
    if (config.model.architectures is not None or info is None or info.shape is None
            or info.task != "classification" or resolve_device(config.train.device).type != "cpu"):
        return None
    method, train = resolve_method(config), config.train
    input_shape, output_dim = info.shape(config.dataset)
    stub = SimpleNamespace(name=config.dataset.name, task=info.task, input_shape=input_shape, output_dim=output_dim)
    with torch.random.fork_rng(devices=[]):
        model = build_model(config.model.name, stub, config.model.options)  # type: ignore[arg-type]
    if config.train.conv_kernel != "auto":
        model.conv_kernel = config.train.conv_kernel
    if not model.loops_clients_on(torch.device("cpu")):
        return None
    spec = ParamSpec.from_module(model)
    training = replace(method.training, steps=min(method.training.steps, CHOICE_STEPS))
    rule = method.client_rule(client_setting(model, spec, stub, training))  # type: ignore[arg-type]
    clients = config.dataset.num_clients or train.clients_per_round
    shape = RoundShape(min(train.clients_per_round, clients) * method.training.steps,
                       2 * clients * SCORED_ROWS / train.eval_every)
    return choose_torch_threads(model, spec, rule, tuple(input_shape), output_dim, shape)


def build_setup(config: RunConfig, federation: Federation | None = None) -> Setup:
    """The data (``federation``, or built from ``config.dataset``), the clients' side and the method, in the order
    that fixes every random draw."""
    if config.torch_threads:
        set_run_threads(config.torch_threads)
    method = resolve_method(config)
    device = resolve_device(config.train.device)
    if federation is None:
        check_before_data(config, method)
    fed = federation if federation is not None else build_federation(config.dataset, config.seed)
    clients = ClientSide.build(config, fed, method, device)
    context = MethodContext(
        spec=clients.spec, init_weights=clients.init_weights, num_clients=fed.num_clients,
        train_client_ids=fed.train_client_ids, novel_client_ids=fed.novel_client_ids,
        client_graph=clients.federation.client_graph, task=fed.task, seed=rng.stream_seed(config.seed, 0, "method"),
        head=() if clients.family is not None else clients.model.head_names, architectures=clients.family,
        device=device)
    # what the method creates without naming a device lands on the run's device; its random initial values are
    # drawn on the host, so a GPU run starts from the CPU run's numbers
    with torch.device(device), HostRandomDraws():
        server = method.cls(context, method.options)
    return Setup(config, clients, server)


__all__ = ["RELEASES_NOTHING", "ClientSide", "MethodSetup", "Setup", "build_setup", "client_setting", "privacy_plan",
           "resolve_method", "run_roots", "without_needless_privacy"]
