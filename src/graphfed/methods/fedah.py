"""FedAH (Aggregated Head): element-wise aggregation of the local and the global model head.

Per round t, client i receives the global model (body phi^t, head H^t) and holds its local head H_i:
  head aggregation: H_hat_i = H_i + (H^t - H_i) * W_i, element-wise weights W_i in [0, 1] learned on local data
                    (W <- clip(W - eta * dL/dW, 0, 1)), the body taken from the global model as received;
  local training: K SGD steps from (phi^t, H_hat_i); the trained model is uploaded and its head kept as H_i;
  server: FedAvg.
Each client evaluates its own latest model. This is FedALA's adaptive local aggregation applied to the head
the target model declares (``TargetModel.head_module``) instead of the last p tensors, so both share one rule
(``FedALARule``); the aggregation phase takes ceil(s/100 * K) steps (s = ``rand_percent``). Novel clients have
no head of their own and evaluate the global model as received.
"""

from __future__ import annotations

from pydantic import Field

from graphfed.client.contract import ClientRule, ClientSetting
from graphfed.errors import ConfigError
from graphfed.methods.fedala import FedALARule
from graphfed.methods.fedavg import FedAvg, FedAvgOptions


class FedAHOptions(FedAvgOptions):
    rand_percent: float = Field(default=80.0, ge=0, le=100,
                                description="s: head-aggregation steps = ceil(s/100 * K)")
    eta: float = Field(default=1.0, gt=0, description="learning rate of the element-wise head weights W")


class FedAH(FedAvg):
    name = "fedah"
    summary = "FedAvg whose clients blend the global head into their own head with learned element-wise weights"
    server_weighting = ("sample-weighted mean, FedAvg's rule (FedAH's server is FedAvg's; the head aggregation "
                        "happens on each client)")
    Options = FedAHOptions

    @classmethod
    def client_rule(cls, options: FedAHOptions, setting: ClientSetting) -> ClientRule:
        if not setting.head:
            raise ConfigError("FedAH needs a model that declares its head (TargetModel.head_module)")
        return FedALARule(setting, setting.head, options.rand_percent, options.eta)
