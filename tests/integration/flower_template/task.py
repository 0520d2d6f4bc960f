"""The task of Flower 1.41's PyTorch app template, in its shape: the small CNN of
PyTorch's 60-minute blitz (3x32x32 inputs, 10 classes), Adam training that returns the
mean batch loss, and a test that returns loss and accuracy; batches are dicts with
``img`` and ``label``.

One change: the template's ``load_data`` downloads CIFAR-10 from the Hugging Face hub
through ``flwr_datasets`` (an IID partitioner, then an 80/20 split of each partition),
which cannot run offline.  Here ``load_data`` cuts the same IID partitions and 80/20
splits from a seeded 1,200-image subset of the local Fashion-MNIST training split
(``fedsys.data.load_dataset``: ``data-dir`` unset, so ``$FEDSYS_DATA`` or the Debian
package), padded to 32x32 and repeated over 3 channels so that the template's network
takes it unchanged, and normalised as the template normalises (mean 0.5, std 0.5).
"""

import torch
import torch.nn.functional as F  # noqa: N812  (the template spells it so)
from torch import nn
from torch.utils.data import DataLoader, Dataset

from fedsys.data import load_dataset

SUBSET = 1200  # images shared out among the partitions (keeps the CI run small)


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class Images(Dataset):
    """``{"img", "label"}`` items, as the template's transformed partitions give them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"img": self.x[i], "label": self.y[i]}


def load_data(partition_id: int, num_partitions: int) -> tuple[DataLoader, DataLoader]:
    """This partition's training and validation loaders (the one change, see above)."""
    ds = load_dataset("fashion-mnist")
    pick = torch.randperm(len(ds.y_train), generator=torch.Generator().manual_seed(0))[:SUBSET]
    mine = torch.tensor_split(pick, num_partitions)[partition_id]  # IID, contiguous shards
    x = F.pad(ds.x_train[mine].float() / 255.0, (2, 2, 2, 2)).repeat(1, 3, 1, 1)
    x, y = (x - 0.5) / 0.5, ds.y_train[mine]
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(42))
    n_test = len(y) // 5  # 80 % train, 20 % test
    test_idx, train_idx = order[:n_test], order[n_test:]
    trainloader = DataLoader(Images(x[train_idx], y[train_idx]), batch_size=32, shuffle=True)
    testloader = DataLoader(Images(x[test_idx], y[test_idx]), batch_size=32)
    return trainloader, testloader


def train(net: Net, trainloader: DataLoader, epochs: int, lr: float, device: torch.device) -> float:
    """Train with Adam; the mean loss over all batches."""
    net.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(batch["img"].to(device)), batch["label"].to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / len(trainloader)


def test(net: Net, testloader: DataLoader, device: torch.device) -> tuple[float, float]:
    """The mean batch loss and the accuracy on ``testloader``."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    net.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for batch in testloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += int((outputs.argmax(1) == labels).sum().item())
    return loss / len(testloader), correct / len(testloader.dataset)
